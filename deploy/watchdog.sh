# Sourced by deploy/kafka/kafka.sh and deploy/registry/registry.sh: the process checks and the --watch-pid
# watchdog they share. Uses the caller's RUN_DIR (the run directory the PIDs are recorded in).

# True while PID runs (a zombie no longer counts: it only waits for its parent to reap it).
alive() { [[ -r "/proc/$1/stat" && "$(cut -d' ' -f3 "/proc/$1/stat" 2>/dev/null)" != Z ]]; }

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# start_watchdog SCRIPT PID : runs 'SCRIPT _watch PID --dir RUN_DIR' detached (its own session, so the
# caller's Ctrl-C does not reach it) and records its PID in RUN_DIR/watchdog.pid.
start_watchdog() {
    setsid bash "$1" _watch "$2" --dir "$RUN_DIR" </dev/null >>"$RUN_DIR/watchdog.log" 2>&1 &
    echo $! >"$RUN_DIR/watchdog.pid"
}

# watchdog_pid NAME : the recorded watchdog's PID, while that process still is NAME's watchdog.
watchdog_pid() {
    local pid
    pid="$(cat "$RUN_DIR/watchdog.pid" 2>/dev/null)" || return 1
    [[ "$pid" =~ ^[0-9]+$ && -r "/proc/$pid/cmdline" ]] || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF "$1 _watch" || return 1
    echo "$pid"
}

# stop_watchdog NAME : before a stop, so that the watchdog does not stop a later start's processes.
stop_watchdog() {
    local pid
    if pid="$(watchdog_pid "$1")"; then kill -TERM "$pid" 2>/dev/null || true; fi
    rm -f "$RUN_DIR/watchdog.pid"
}

# watch_then PID NAME STOP_COMMAND : the watchdog's body; waits for PID to exit, then runs STOP_COMMAND.
watch_then() {
    while kill -0 "$1" 2>/dev/null; do sleep 1; done
    rm -f "$RUN_DIR/watchdog.pid"  # before stopping, so the stop does not signal this process
    echo "$2: watched process $1 exited; stopping what it started in $RUN_DIR" >&2
    "$3"
}
