#!/usr/bin/env bash
# Runs a real Apache Kafka 4.x cluster (KRaft, combined broker+controller, loopback only) from the
# Maven artifacts resolved by pom.xml next to this script: for development, tests and CI, no Docker.
#
# Guarantees:
#   - `start` returns 0 only once every node is unfenced and an AdminClient request succeeds; it prints
#     the bootstrap servers string (and nothing else) on stdout.
#   - `stop`, `kill-node` only ever signal the PIDs this script recorded in the run directory, and only
#     while that PID still runs kafka.Kafka with this run directory's server.properties.
#   - `start` always begins a fresh cluster (new cluster id, empty data); `start-node` keeps a node's data.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../watchdog.sh
source "$SCRIPT_DIR/../watchdog.sh"
LIB_DIR="$SCRIPT_DIR/lib"
HELP_TEXT="usage: kafka.sh COMMAND [options]

Commands:
  start [--port P] [--nodes 1|3] [--dir DIR] [--controller-port C] [--heap-mb M] [--timeout S]
        [--sasl] [--tls]
        Start a fresh cluster and wait until it serves AdminClient requests; print the bootstrap
        servers. Client ports P..P+nodes-1 (default 9092), controller ports C.. (default P+100).
        --sasl adds a SASL_PLAINTEXT listener on P+200.. (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512; user
        \$SLUICE_KAFKA_SASL_USER, default sluice, password \$SLUICE_KAFKA_SASL_PASSWORD, default a
        random one); --tls (implies --sasl) adds a SASL_SSL listener on P+300.. with a throw-away CA
        in DIR/tls/. The plaintext listener stays as it is.
        --netns NS1=IP1,NS2=IP2,... runs node N in the network namespace NSn (made beforehand, e.g.
        by tests/support/network.py), listening and advertising on IPn instead of 127.0.0.1: each
        node a host of its own, for network-fault tests (root only; not with --sasl / --tls).
  security [--dir DIR]
        Print the secured listeners' settings as shell assignments (SLUICE_KAFKA_SASL_BOOTSTRAP,
        SLUICE_KAFKA_SASL_USER, SLUICE_KAFKA_SASL_PASSWORD, SLUICE_KAFKA_TLS_BOOTSTRAP,
        SLUICE_KAFKA_TLS_CA); DIR/security.env holds the same, readable by its owner only.
  stop [--dir DIR] [--timeout S]
        SIGTERM the recorded nodes, wait up to S seconds (default 30), then SIGKILL stragglers.
  status [--dir DIR]
        Print each node's state; exit 0 only if all nodes run.
  kill-node N [--signal KILL|TERM] [--dir DIR]
        Stop node N (KILL = crash, TERM = controlled shutdown), keeping its data.
  start-node N [--dir DIR] [--timeout S]
        Restart node N of a running cluster on its old data and wait until it is back.
  start ... --watch-pid PID
        Also stop the cluster once process PID exits (test runners pass their own PID, so a
        killed test run leaves no broker behind).
  bootstrap [--dir DIR]
        Print the bootstrap servers of the cluster in DIR.

Run directory: --dir, else \$SLUICE_KAFKA_DIR, else deploy/kafka/run/. Node N lives in DIR/node-N/
(server.properties, data/, server.log, stdout.log, pid).
Environment: SLUICE_PYTHON (python with confluent_kafka for the readiness check),
SLUICE_KAFKA_HEAP_MB (default 512), SLUICE_KAFKA_JVM_OPTS (extra JVM options for the brokers,
default -XX:TieredStopAtLevel=1 for a fast start; set it to '' for benchmarks),
SLUICE_KAFKA_VERSION (default: the pom's; lib/ is re-resolved whenever the version changes).
No Java here? Point Sluice at an existing broker with SLUICE_KAFKA_BOOTSTRAP=host:port instead."

die() { echo "kafka.sh: $*" >&2; exit 1; }

need_tool() {  # need_tool NAME WHY
    if ! command -v "$1" >/dev/null 2>&1; then
        echo "kafka.sh: '$1' not found ($2); install it, or set SLUICE_KAFKA_BOOTSTRAP=host:port to use an existing broker instead" >&2
        exit 2
    fi
}

# ---------------------------------------------------------------- jars

resolve_jars() {
    # lib/ appears complete or not at all: the jars are copied into a temporary directory that is
    # renamed to lib/, so an interrupted or concurrent resolution never leaves a partial lib/.
    # The version: $SLUICE_KAFKA_VERSION, else the pom's; lib/ is redone whenever it changes.
    local version="${SLUICE_KAFKA_VERSION:-$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$SCRIPT_DIR/pom.xml")}"
    local marker="$LIB_DIR/.resolved"
    resolved() { [[ -f "$marker" && "$(cat "$marker")" == "$version" ]]; }
    resolved && return 0
    need_tool mvn "needed once to fetch the Kafka jars from Maven Central into deploy/kafka/lib"
    echo "kafka.sh: resolving Kafka jars with Maven into $LIB_DIR ..." >&2
    local tmp
    tmp="$(mktemp -d "$SCRIPT_DIR/.lib.XXXXXX")"
    # Full plugin coordinates: no plugin-prefix lookup, so a warm ~/.m2 suffices offline (-o).
    local args=(-q -f "$SCRIPT_DIR/pom.xml" "-Dkafka.lib.dir=$tmp" "-Dkafka.version=$version"
        org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies)
    if ! { mvn -o "${args[@]}" >/dev/null 2>&1 || mvn "${args[@]}" >&2; }; then
        rm -rf "$tmp"
        die "mvn could not resolve the Kafka jars (see the Maven output above)"
    fi
    echo "$version" >"$tmp/.resolved"
    if resolved; then rm -rf "$tmp"; return 0; fi  # a concurrent start finished first
    rm -rf "$LIB_DIR"
    mv -T "$tmp" "$LIB_DIR"
}

# ---------------------------------------------------------------- run directory state

node_dir() { echo "$RUN_DIR/node-$1"; }

# node_host N / node_netns N : node N's address, and its network namespace ("" outside --netns).
node_host() {
    if [[ -z "${NETNS:-}" ]]; then echo 127.0.0.1; return; fi
    local spec
    IFS=, read -ra spec <<<"$NETNS"
    echo "${spec[$(($1 - 1))]#*=}"
}
node_netns() {
    if [[ -z "${NETNS:-}" ]]; then return; fi
    local spec
    IFS=, read -ra spec <<<"$NETNS"
    echo "${spec[$(($1 - 1))]%%=*}"
}

load_cluster() {
    [[ -f "$RUN_DIR/cluster.env" ]] || die "no cluster in $RUN_DIR (run 'kafka.sh start' first)"
    # shellcheck disable=SC1091
    source "$RUN_DIR/cluster.env"
}

# Prints the PID of node N if it is alive and is the broker this run directory started.
node_pid() {
    local pidfile pid
    pidfile="$(node_dir "$1")/pid"
    [[ -f "$pidfile" ]] || return 1
    pid="$(cat "$pidfile")"
    [[ "$pid" =~ ^[0-9]+$ && -r "/proc/$pid/cmdline" ]] || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF "kafka.Kafka $(node_dir "$1")/server.properties" || return 1
    echo "$pid"
}


log_tails() {  # log_tails NODE... : the end of each node's logs, for error messages
    local n
    for n in "$@"; do
        echo "---- node $n: $(node_dir "$n")/server.log (last 25 lines)"
        tail -n 25 "$(node_dir "$n")/server.log" 2>/dev/null || true
        echo "---- node $n: stdout.log (last 10 lines)"
        tail -n 10 "$(node_dir "$n")/stdout.log" 2>/dev/null || true
    done
}

# ---------------------------------------------------------------- configuration

write_server_properties() {  # write_server_properties NODE : fills in server.properties.template
    local n="$1" voters="" i text
    for ((i = 1; i <= NODES; i++)); do
        voters+="${voters:+,}$i@$(node_host "$i"):$((CONTROLLER_PORT + i - 1))"
    done
    local replication=$((NODES >= 3 ? 3 : NODES))
    local min_isr=$((replication >= 3 ? 2 : 1))
    text="$(<"$SCRIPT_DIR/server.properties.template")"
    text="${text//@NODE_ID@/$n}"
    text="${text//@HOST@/$(node_host "$n")}"
    text="${text//@VOTERS@/$voters}"
    text="${text//@PORT@/$((PORT + n - 1))}"
    text="${text//@CONTROLLER_PORT@/$((CONTROLLER_PORT + n - 1))}"
    text="${text//@DATA_DIR@/$(node_dir "$n")/data}"
    text="${text//@REPLICATION@/$replication}"
    text="${text//@MIN_ISR@/$min_isr}"
    local listeners="" protocols=""
    if ((SASL)); then
        listeners+=",SASL_PLAINTEXT://127.0.0.1:$((PORT + 200 + n - 1))"
        protocols+=",SASL_PLAINTEXT:SASL_PLAINTEXT"
        text+=$'\n'"$(<"$SCRIPT_DIR/sasl.properties.template")"
    fi
    if ((TLS)); then
        listeners+=",SASL_SSL://127.0.0.1:$((PORT + 300 + n - 1))"
        protocols+=",SASL_SSL:SASL_SSL"
        text+=$'\n'"$(<"$SCRIPT_DIR/tls.properties.template")"
    fi
    text="${text//@EXTRA_LISTENERS@/$listeners}"
    text="${text//@EXTRA_ADVERTISED@/$listeners}"
    text="${text//@EXTRA_PROTOCOLS@/$protocols}"
    text="${text//@SASL_USER@/${SASL_USER:-}}"
    text="${text//@SASL_PASSWORD@/${SASL_PASSWORD:-}}"
    text="${text//@TLS_DIR@/$RUN_DIR/tls}"
    [[ ! "$text" =~ @[A-Z_]+@ ]] || die "server.properties.template has a placeholder kafka.sh does not fill in"
    printf '%s\n' "$text" >"$(node_dir "$n")/server.properties"
}

# ---------------------------------------------------------------- SASL / TLS (start --sasl, --tls)

setup_security() {  # credentials, TLS material and DIR/security.env for a --sasl / --tls cluster
    SASL_USER="${SLUICE_KAFKA_SASL_USER:-sluice}"
    # Random by default, so a test can look for it in logs and be sure no other text matches.
    SASL_PASSWORD="${SLUICE_KAFKA_SASL_PASSWORD:-$(head -c 64 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' | head -c 24)}"
    # They go into JAAS options ("...") and --add-scram's [name=...,password=...]: keep them plain.
    [[ "$SASL_USER" =~ ^[A-Za-z0-9_.-]+$ ]] || die "SLUICE_KAFKA_SASL_USER may only hold letters, digits, '_', '.', '-'"
    [[ "$SASL_PASSWORD" =~ ^[A-Za-z0-9_.-]+$ ]] || die "SLUICE_KAFKA_SASL_PASSWORD may only hold letters, digits, '_', '.', '-'"
    local sasl_bootstrap="" tls_bootstrap="" i
    for ((i = 0; i < NODES; i++)); do
        sasl_bootstrap+="${sasl_bootstrap:+,}127.0.0.1:$((PORT + 200 + i))"
        tls_bootstrap+="${tls_bootstrap:+,}127.0.0.1:$((PORT + 300 + i))"
    done
    if ((TLS)); then make_tls_material "$RUN_DIR/tls"; fi
    (
        umask 077
        {
            echo "SLUICE_KAFKA_SASL_BOOTSTRAP=$sasl_bootstrap"
            echo "SLUICE_KAFKA_SASL_USER=$SASL_USER"
            echo "SLUICE_KAFKA_SASL_PASSWORD=$SASL_PASSWORD"
            if ((TLS)); then
                echo "SLUICE_KAFKA_TLS_BOOTSTRAP=$tls_bootstrap"
                echo "SLUICE_KAFKA_TLS_CA=$RUN_DIR/tls/ca.pem"
            fi
        } >"$RUN_DIR/security.env"
    )
}

make_tls_material() {  # make_tls_material DIR : a throw-away CA and a broker key/certificate for 127.0.0.1
    local dir="$1"
    need_tool openssl "--tls makes a throw-away certificate authority with it"
    rm -rf "$dir"
    mkdir -p "$dir"
    (
        umask 077
        cd "$dir"
        openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=sluice-test-ca" \
            -keyout ca.key -out ca.pem -addext "basicConstraints=critical,CA:TRUE" \
            -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
        openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" -keyout broker.key -out broker.csr 2>/dev/null
        printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n' >broker.ext
        openssl x509 -req -in broker.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
            -extfile broker.ext -out broker.crt 2>/dev/null
        # Kafka's PEM key store: one file with the PKCS#8 private key, then the certificate chain.
        openssl pkcs8 -topk8 -nocrypt -in broker.key -out broker.pk8
        cat broker.pk8 broker.crt ca.pem >broker.pem
        rm -f ca.key broker.key broker.pk8 broker.csr broker.ext ca.srl
    ) || die "could not make the TLS certificates in $dir with openssl"
}

random_cluster_id() {
    # A Kafka Uuid is 16 random bytes in URL-safe base64 without padding; Kafka avoids a leading '-'.
    local id
    while :; do
        id="$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')"
        [[ "$id" != -* ]] && { echo "$id"; return; }
    done
}

# ---------------------------------------------------------------- processes

launch_node() {  # launch_node NODE : starts the JVM in its own session and records its PID
    local n="$1" dir
    dir="$(node_dir "$n")"
    # Readiness looks for the startup line only past this offset: after a restart the old line is stale.
    if [[ -f "$dir/server.log" ]]; then wc -c <"$dir/server.log" >"$dir/log_offset"; else echo 0 >"$dir/log_offset"; fi
    : >"$dir/stdout.log"
    # setsid: the broker survives the shell that started it and ignores the caller's Ctrl-C;
    # it is stopped by 'stop' through the PID recorded here.
    # Default extra option: C1 JIT only, which halves the CPU a node burns to start (2 s instead of
    # 4 s on a 2-core machine); 100k records through confluent-kafka ran as fast as with the full
    # JIT. For broker-bound benchmarks set SLUICE_KAFKA_JVM_OPTS='' (or other options).
    local jvm_opts="${SLUICE_KAFKA_JVM_OPTS--XX:TieredStopAtLevel=1}" netns=()
    # 'ip netns exec' execs java in place: the recorded PID is still the broker's
    if [[ -n "$(node_netns "$n")" ]]; then netns=(ip netns exec "$(node_netns "$n")"); fi
    # shellcheck disable=SC2086 # jvm_opts holds several options
    setsid "${netns[@]}" java -Xms"${HEAP_MB}m" -Xmx"${HEAP_MB}m" -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
        -XX:+ExitOnOutOfMemoryError -Djava.awt.headless=true $jvm_opts \
        -Dlog4j2.configurationFile="$SCRIPT_DIR/log4j2.properties" -Dkafka.logs.dir="$dir" \
        -cp "$LIB_DIR/*" kafka.Kafka "$dir/server.properties" \
        </dev/null >>"$dir/stdout.log" 2>&1 &
    echo $! >"$dir/pid"
}

find_python() {
    local py
    for py in "${SLUICE_PYTHON:-}" "$SCRIPT_DIR/../../.venv/bin/python" python3; do
        [[ -n "$py" ]] || continue
        command -v "$py" >/dev/null 2>&1 || continue
        "$py" -c 'import confluent_kafka' >/dev/null 2>&1 && { echo "$py"; return 0; }
    done
    return 1
}

# wait_ready TIMEOUT_S NODE... : until each listed node is unfenced and serves requests (see
# wait_ready.py); fails early if one of their processes exits.
wait_ready() {
    local timeout_s="$1"; shift
    local args=() n py
    for n in "$@"; do
        args+=("$n:$(cat "$(node_dir "$n")/pid"):$(node_dir "$n")/server.log:$(cat "$(node_dir "$n")/log_offset")")
    done
    if py="$(find_python)"; then
        "$py" "$SCRIPT_DIR/wait_ready.py" "$BOOTSTRAP" "$timeout_s" "${args[@]}"
        return
    fi
    # No Python with confluent_kafka: rely on the broker's own "started" log line.
    echo "kafka.sh: no python with confluent_kafka (set SLUICE_PYTHON); waiting for the startup log line only" >&2
    local deadline=$((SECONDS + ${timeout_s%.*})) pending dir
    while ((SECONDS < deadline)); do
        pending=0
        for n in "$@"; do
            dir="$(node_dir "$n")"
            node_pid "$n" >/dev/null || { echo "node $n exited during startup" >&2; return 1; }
            tail -c +"$(($(cat "$dir/log_offset") + 1))" "$dir/server.log" 2>/dev/null |
                grep -q "Kafka Server started" || pending=1
        done
        ((pending == 0)) && return 0
        sleep 0.3
    done
    echo "not ready after ${timeout_s}s" >&2
    return 1
}

# signal_and_wait SIGNAL TIMEOUT_S NODE... : signals the recorded nodes, SIGKILLs any left at timeout.
signal_and_wait() {
    local sig="$1" timeout_s="$2"; shift 2
    local n pid pids=() deadline
    for n in "$@"; do
        if pid="$(node_pid "$n")"; then kill "-$sig" "$pid" 2>/dev/null || true; pids+=("$pid"); fi
    done
    deadline=$((SECONDS + timeout_s))
    for pid in "${pids[@]}"; do
        while alive "$pid" && ((SECONDS < deadline)); do sleep 0.1; done
    done
    for n in "$@"; do
        if pid="$(node_pid "$n")"; then
            echo "kafka.sh: node $n (pid $pid) still running after ${timeout_s}s; sending SIGKILL" >&2
            kill -KILL "$pid" 2>/dev/null || true
            while alive "$pid"; do sleep 0.1; done
        fi
        rm -f "$(node_dir "$n")/pid"
    done
}

all_nodes() { seq 1 "$NODES"; }

# ---------------------------------------------------------------- commands

cmd_start() {
    need_tool java "the Kafka broker runs on a Java 17+ runtime"
    [[ "$NODES" =~ ^[1-9]$ ]] || die "--nodes must be between 1 and 9 (got '$NODES')"
    [[ "$PORT" =~ ^[0-9]+$ ]] || die "--port must be a number (got '$PORT')"
    [[ -z "$WATCH_PID" || "$WATCH_PID" =~ ^[0-9]+$ ]] || die "--watch-pid must be a process id (got '$WATCH_PID')"
    CONTROLLER_PORT="${CONTROLLER_PORT:-$((PORT + 100))}"
    HEAP_MB="${HEAP_MB:-${SLUICE_KAFKA_HEAP_MB:-512}}"
    if [[ -n "$NETNS" ]]; then
        local specs spec
        IFS=, read -ra specs <<<"$NETNS"
        ((${#specs[@]} == NODES)) || die "--netns names ${#specs[@]} namespaces for $NODES nodes (one NS=IP per node)"
        ((SASL == 0)) || die "--netns does not go with --sasl / --tls"
        for spec in "${specs[@]}"; do
            [[ "$spec" =~ ^[A-Za-z0-9_.-]+=[0-9.]+$ ]] || die "--netns wants NS=IP per node, comma-separated (got '$spec')"
            ip netns exec "${spec%%=*}" true 2>/dev/null ||
                die "network namespace '${spec%%=*}' does not exist (or this is not root)"
        done
    fi
    local d
    for d in "$RUN_DIR"/node-*; do
        [[ -d "$d" ]] && node_pid "${d##*/node-}" >/dev/null &&
            die "a cluster is already running in $RUN_DIR (run 'kafka.sh stop --dir $RUN_DIR' first)"
    done
    resolve_jars
    local i p extra_ports
    for ((i = 0; i < NODES; i++)); do
        extra_ports=""
        if ((SASL)); then extra_ports+=" $((PORT + 200 + i))"; fi
        if ((TLS)); then extra_ports+=" $((PORT + 300 + i))"; fi
        for p in $((PORT + i)) $((CONTROLLER_PORT + i)) $extra_ports; do
            port_in_use "$p" && die "port $p on 127.0.0.1 is already in use (choose another with --port / --controller-port)"
        done
    done

    BOOTSTRAP=""
    for ((i = 0; i < NODES; i++)); do BOOTSTRAP+="${BOOTSTRAP:+,}$(node_host $((i + 1))):$((PORT + i))"; done
    local cluster_id
    cluster_id="$(random_cluster_id)"
    rm -rf "$RUN_DIR"/node-*
    cat >"$RUN_DIR/cluster.env" <<EOF
NODES=$NODES
PORT=$PORT
CONTROLLER_PORT=$CONTROLLER_PORT
HEAP_MB=$HEAP_MB
CLUSTER_ID=$cluster_id
BOOTSTRAP=$BOOTSTRAP
NETNS=$NETNS
SASL=$SASL
TLS=$TLS
EOF
    local n fmt_pids=() scram=()
    rm -f "$RUN_DIR/security.env"
    if ((SASL)); then
        setup_security
        # SCRAM credentials live in the metadata log; formatting writes them before the first start.
        scram=(--add-scram "SCRAM-SHA-256=[name=$SASL_USER,password=$SASL_PASSWORD]"
            --add-scram "SCRAM-SHA-512=[name=$SASL_USER,password=$SASL_PASSWORD]")
    fi
    for n in $(all_nodes); do
        mkdir -p "$(node_dir "$n")"
        write_server_properties "$n"
        # Formatting is a short JVM run per node; run them side by side.
        java -Xmx256m -XX:TieredStopAtLevel=1 -cp "$LIB_DIR/*" kafka.tools.StorageTool format \
            -t "$cluster_id" -c "$(node_dir "$n")/server.properties" "${scram[@]}" >"$(node_dir "$n")/format.log" 2>&1 &
        fmt_pids+=($!)
    done
    local k=0
    for n in $(all_nodes); do
        wait "${fmt_pids[$k]}" || die "formatting node $n failed: $(tail -n 5 "$(node_dir "$n")/format.log" | tr '\n' ' ')"
        k=$((k + 1))
    done
    for n in $(all_nodes); do launch_node "$n"; done
    local err
    if ! err="$(wait_ready "$TIMEOUT_S" $(all_nodes) 2>&1)"; then
        local tails
        tails="$(log_tails $(all_nodes))"
        signal_and_wait KILL 10 $(all_nodes)
        die "cluster in $RUN_DIR did not become ready: $err
$tails"
    fi
    if [[ -n "$WATCH_PID" ]]; then
        start_watchdog "$SCRIPT_DIR/kafka.sh" "$WATCH_PID"
    fi
    echo "$BOOTSTRAP"
}

# The watchdog of --watch-pid: runs 'stop' once the watched process is gone.
cmd_watch() { watch_then "$NODE_ARG" kafka.sh cmd_stop; }  # internal: kafka.sh _watch PID --dir DIR

cmd_stop() {
    [[ -f "$RUN_DIR/cluster.env" ]] || { echo "kafka.sh: no cluster in $RUN_DIR; nothing to stop" >&2; return 0; }
    load_cluster
    stop_watchdog kafka.sh
    signal_and_wait TERM "$STOP_TIMEOUT_S" $(all_nodes)
}

cmd_status() {
    load_cluster
    local n pid down=0
    for n in $(all_nodes); do
        if pid="$(node_pid "$n")"; then
            echo "node $n: running (pid $pid, $(node_host "$n"):$((PORT + n - 1)))"
        else
            echo "node $n: stopped"
            down=1
        fi
    done
    return "$down"
}

check_node_arg() {
    [[ "$NODE_ARG" =~ ^[0-9]+$ ]] && ((NODE_ARG >= 1 && NODE_ARG <= NODES)) ||
        die "node must be between 1 and $NODES (got '${NODE_ARG}')"
}

cmd_kill_node() {
    load_cluster
    check_node_arg
    [[ "$SIGNAL" == KILL || "$SIGNAL" == TERM ]] || die "--signal must be KILL or TERM (got '$SIGNAL')"
    node_pid "$NODE_ARG" >/dev/null || die "node $NODE_ARG is not running"
    signal_and_wait "$SIGNAL" "$STOP_TIMEOUT_S" "$NODE_ARG"
}

cmd_start_node() {
    need_tool java "the Kafka broker runs on a Java 17+ runtime"
    load_cluster
    check_node_arg
    node_pid "$NODE_ARG" >/dev/null && die "node $NODE_ARG is already running"
    launch_node "$NODE_ARG"
    local err
    if ! err="$(wait_ready "$TIMEOUT_S" "$NODE_ARG" 2>&1)"; then
        local tails
        tails="$(log_tails "$NODE_ARG")"
        signal_and_wait KILL 10 "$NODE_ARG"
        die "node $NODE_ARG did not come back: $err
$tails"
    fi
    echo "$BOOTSTRAP"
}

# ---------------------------------------------------------------- arguments

COMMAND="${1:-}"
[[ -n "$COMMAND" ]] || { echo "$HELP_TEXT" >&2; exit 2; }
shift
case "$COMMAND" in -h | --help | help) echo "$HELP_TEXT"; exit 0 ;; esac

RUN_DIR="${SLUICE_KAFKA_DIR:-$SCRIPT_DIR/run}"
PORT=9092 NODES=1 CONTROLLER_PORT="" HEAP_MB="" TIMEOUT_S=120 STOP_TIMEOUT_S=30 SIGNAL=KILL NODE_ARG="" WATCH_PID=""
SASL=0 TLS=0 NETNS=""
if [[ "$COMMAND" == kill-node || "$COMMAND" == start-node || "$COMMAND" == _watch ]]; then
    NODE_ARG="${1:-}"
    [[ -n "$NODE_ARG" ]] || die "$COMMAND needs a node number"
    shift
fi
while (($#)); do
    case "$1" in
        --port) PORT="${2:?--port needs a value}"; shift 2 ;;
        --nodes) NODES="${2:?--nodes needs a value}"; shift 2 ;;
        --dir) RUN_DIR="${2:?--dir needs a value}"; shift 2 ;;
        --controller-port) CONTROLLER_PORT="${2:?--controller-port needs a value}"; shift 2 ;;
        --heap-mb) HEAP_MB="${2:?--heap-mb needs a value}"; shift 2 ;;
        --watch-pid) WATCH_PID="${2:?--watch-pid needs a value}"; shift 2 ;;
        --signal) SIGNAL="${2:?--signal needs a value}"; shift 2 ;;
        --sasl) SASL=1; shift ;;
        --netns) NETNS="${2:?--netns needs NS1=IP1,NS2=IP2,...}"; shift 2 ;;
        --tls) SASL=1 TLS=1; shift ;;
        --timeout)
            TIMEOUT_S="${2:?--timeout needs a value}"; STOP_TIMEOUT_S="$TIMEOUT_S"; shift 2 ;;
        -h | --help) echo "$HELP_TEXT"; exit 0 ;;
        *) die "unknown option '$1' for '$COMMAND' (see kafka.sh --help)" ;;
    esac
done
if [[ "$COMMAND" == start ]]; then
    mkdir -p "$RUN_DIR" 2>/dev/null || die "cannot create run directory $RUN_DIR"
fi
# Absolute, so the recorded command lines (and the PID checks against them) do not depend on the cwd.
if [[ -d "$RUN_DIR" ]]; then RUN_DIR="$(cd "$RUN_DIR" && pwd)"; fi

case "$COMMAND" in
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    kill-node) cmd_kill_node ;;
    start-node) cmd_start_node ;;
    bootstrap) load_cluster; echo "$BOOTSTRAP" ;;
    security)
        load_cluster
        [[ -f "$RUN_DIR/security.env" ]] || die "the cluster in $RUN_DIR has no secured listener (start it with --sasl or --tls)"
        cat "$RUN_DIR/security.env" ;;
    _watch) cmd_watch ;;
    *) die "unknown command '$COMMAND' (see kafka.sh --help)" ;;
esac
