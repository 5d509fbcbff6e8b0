#!/usr/bin/env bash
# A real single-node SLURM 22.05 cluster (munge, MariaDB, slurmdbd, slurmctld, slurmd) for
# tests/test_slurm.py, started by hand (no systemd) as root; see shared/notes/environment.md.
#
#   bash .ci/slurm.sh start    # install if absent, start, wait until sinfo and sacct answer,
#                              # print `export SLURM_CONF=...` and write it to $STATE/env.sh
#   bash .ci/slurm.sh stop     # kill the daemons this script started, by their recorded PIDs
#   bash .ci/slurm.sh status   # daemons alive? sinfo
#
# State (configs, spool, MariaDB datadir, logs, PIDs) lives under MARIN_SLURM_DIR
# (default /tmp/marin-slurm). A second cluster runs beside the first with its own MARIN_SLURM_DIR,
# MARIN_SLURM_PORT (slurmctld; slurmd and slurmdbd take the next two) and MARIN_SLURM_DB_PORT;
# munged is shared. MARIN_SLURM_MAX_ARRAY_SIZE sets MaxArraySize (default 8). A fresh `start` wipes it; FirstJobId is taken from the clock so job
# ids do not restart at 1 and stale submitit folders cannot alias new jobs.
set -euo pipefail

STATE="${MARIN_SLURM_DIR:-/tmp/marin-slurm}"
CONF="$STATE/etc/slurm.conf"
PIDS="$STATE/pids"
LOGS="$STATE/log"
CTLD_PORT="${MARIN_SLURM_PORT:-6817}"
SLURMD_PORT=$((CTLD_PORT + 1))
DBD_PORT=$((CTLD_PORT + 2))
DB_PORT="${MARIN_SLURM_DB_PORT:-3307}"
HOST="$(hostname -s)"
CLUSTER=marin
# the daemons, in start order; stop goes in reverse
DAEMONS=(munged mariadbd slurmdbd slurmctld slurmd)

log() { echo "slurm.sh: $*" >&2; }

alive() {  # alive NAME: its recorded PID is running
    local f="$PIDS/$1.pid"
    [[ -s "$f" ]] && kill -0 "$(cat "$f")" 2>/dev/null
}

wait_for() {  # wait_for SECONDS DAEMON COMMAND...: poll until COMMAND succeeds; fail early if DAEMON died
    local limit=$1 what=$2; shift 2
    local t0=$SECONDS
    until "$@" >/dev/null 2>&1; do
        if [[ -s "$PIDS/$what.pid" ]] && ! alive "$what"; then
            log "$what exited during start-up"; return 1
        fi
        if (( SECONDS - t0 > limit )); then
            log "timed out after ${limit}s waiting for $what"; return 1
        fi
        sleep 0.2
    done
}

install_packages() {
    local missing=()
    for b in /usr/sbin/slurmctld /usr/sbin/slurmd /usr/bin/sinfo /usr/sbin/munged /usr/sbin/slurmdbd /usr/sbin/mariadbd; do
        [[ -x "$b" ]] || missing+=("$b")
    done
    (( ${#missing[@]} == 0 )) && return 0
    log "installing SLURM packages (missing: ${missing[*]})"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends \
        slurmctld slurmd slurm-client munge slurmdbd mariadb-server >"$STATE.install.log" 2>&1 \
        || { tail -20 "$STATE.install.log" >&2; return 1; }
}

write_configs() {
    local cpus mem_mb
    cpus=$(nproc)
    mem_mb=$(awk '/MemTotal/ {print int($2 / 1024 * 0.85)}' /proc/meminfo)
    mkdir -p "$STATE/etc" "$STATE/ctld" "$STATE/spool" "$PIDS" "$LOGS"
    cat >"$CONF" <<EOF
ClusterName=$CLUSTER
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
AuthType=auth/munge
# a requeued job waits cred_expire (default 120 s) before it may start again; short for tests
AuthInfo=cred_expire=10
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool
SlurmctldPidFile=$STATE/slurmctld.pidfile
SlurmdPidFile=$STATE/slurmd.pidfile
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
MailProg=/bin/true
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=$((mem_mb / cpus))
ReturnToService=2
InactiveLimit=0
KillWait=10
MinJobAge=600
# small, so tests/test_slurm.py can submit a study larger than one array (SLURM's default is 1001)
MaxArraySize=${MARIN_SLURM_MAX_ARRAY_SIZE:-8}
FirstJobId=$(( $(date +%s) % 50000000 + 1000 ))
JobRequeue=1
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$DBD_PORT
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
    # slurmdbd has no -f: it reads slurmdbd.conf beside $SLURM_CONF; it must be mode 600
    cat >"$STATE/etc/slurmdbd.conf" <<EOF
AuthType=auth/munge
DbdAddr=127.0.0.1
DbdHost=$HOST
DbdPort=$DBD_PORT
SlurmUser=root
LogFile=$LOGS/slurmdbd.log
PidFile=$STATE/slurmdbd.pidfile
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=marin-slurm
StorageLoc=slurm_acct_db
EOF
    chmod 600 "$STATE/etc/slurmdbd.conf"
    echo "export SLURM_CONF=$CONF" >"$STATE/env.sh"
}

start_munge() {
    # reuse a munged that already answers (e.g. a system one); otherwise start ours as user munge
    if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
        log "munged already running; reusing it"; return 0
    fi
    [[ -s /etc/munge/munge.key ]] || { mungekey --create --keyfile=/etc/munge/munge.key && chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key; }
    install -d -o munge -g munge -m 755 /run/munge
    # munged refuses to run as root; setpriv execs, so $! is munged itself
    setpriv --reuid=munge --regid=munge --init-groups /usr/sbin/munged -F >"$LOGS/munged.out" 2>&1 </dev/null &
    echo $! >"$PIDS/munged.pid"
    wait_for 20 munged bash -c 'munge -n | unmunge'
}

start_mariadb() {
    # mariadbd runs as mysql: its socket, pid file and log live in a directory it owns
    local datadir="$STATE/mysql" run="$STATE/mysql-run" sock="$STATE/mysql-run/mysql.sock"
    install -d -o mysql -g mysql -m 750 "$datadir" "$run"
    mariadb-install-db --user=mysql --datadir="$datadir" --skip-test-db \
        --auth-root-authentication-method=socket >"$LOGS/mariadb-install.log" 2>&1
    mariadbd --no-defaults --user=mysql --datadir="$datadir" --socket="$sock" \
        --bind-address=127.0.0.1 --port="$DB_PORT" --pid-file="$run/mariadbd.pidfile" \
        --log-error="$run/mariadbd.log" --skip-log-bin --innodb-buffer-pool-size=64M \
        --innodb-flush-log-at-trx-commit=0 --innodb-lock-wait-timeout=900 \
        >"$LOGS/mariadbd.out" 2>&1 </dev/null &
    echo $! >"$PIDS/mariadbd.pid"
    wait_for 60 mariadbd mariadb --no-defaults --socket="$sock" -u root -e 'SELECT 1'
    mariadb --no-defaults --socket="$sock" -u root <<'EOF'
CREATE USER IF NOT EXISTS 'slurm'@'%' IDENTIFIED BY 'marin-slurm';
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'%';
FLUSH PRIVILEGES;
EOF
}

start_slurm() {
    export SLURM_CONF="$CONF"
    slurmdbd -D >"$LOGS/slurmdbd.out" 2>&1 </dev/null &
    echo $! >"$PIDS/slurmdbd.pid"
    wait_for 60 slurmdbd sacctmgr -n list cluster
    sacctmgr -i add cluster "$CLUSTER" >/dev/null 2>&1 || true
    slurmctld -D -f "$CONF" >"$LOGS/slurmctld.out" 2>&1 </dev/null &
    echo $! >"$PIDS/slurmctld.pid"
    wait_for 60 slurmctld scontrol ping
    slurmd -D -f "$CONF" -N "$HOST" >"$LOGS/slurmd.out" 2>&1 </dev/null &
    echo $! >"$PIDS/slurmd.pid"
    wait_for 60 slurmd bash -c "sinfo -h -n $HOST -o %T | grep -qx idle"
    wait_for 60 sacct sacct -n -X
}

stop() {
    local i name pid jobs
    # cancel our cluster's jobs first, so their processes end with their steps
    if alive slurmctld; then
        jobs=$(SLURM_CONF="$CONF" squeue -h -o %A 2>/dev/null | sort -u | tr '\n' ' ')
        if [[ -n "${jobs// }" ]]; then
            # shellcheck disable=SC2086
            SLURM_CONF="$CONF" scancel $jobs 2>/dev/null || true
            for _ in $(seq 50); do
                [[ -z "$(SLURM_CONF="$CONF" squeue -h -o %A 2>/dev/null)" ]] && break; sleep 0.2
            done
        fi
    fi
    for (( i = ${#DAEMONS[@]} - 1; i >= 0; i-- )); do
        name=${DAEMONS[$i]}
        [[ -s "$PIDS/$name.pid" ]] || continue
        pid=$(cat "$PIDS/$name.pid")
        if kill -0 "$pid" 2>/dev/null; then
            kill -TERM "$pid" 2>/dev/null || true
            for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
            kill -0 "$pid" 2>/dev/null && { log "$name ($pid) ignored SIGTERM; killing"; kill -KILL "$pid" 2>/dev/null || true; }
        fi
        rm -f "$PIDS/$name.pid"
    done
    # jobs' slurmstepd outlive slurmd; they are children of no recorded PID: end only those
    # whose command line names our config (never by a broad name)
    if [[ -d "$STATE/spool" ]]; then
        for pid in $(pgrep -x slurmstepd 2>/dev/null || true); do
            grep -qszx "SLURM_CONF=$CONF" "/proc/$pid/environ" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true
        done
    fi
}

status() {
    local name ok=0
    for name in "${DAEMONS[@]}"; do
        if alive "$name"; then echo "$name: running (pid $(cat "$PIDS/$name.pid"))"
        elif [[ $name == munged ]] && munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then echo "munged: running (not ours)"
        else echo "$name: stopped"; ok=1; fi
    done
    if [[ -f "$CONF" ]]; then SLURM_CONF="$CONF" sinfo 2>&1 || ok=1; fi
    return $ok
}

start() {
    if [[ -f "$CONF" ]] && alive slurmctld && alive slurmd && alive slurmdbd \
        && SLURM_CONF="$CONF" sinfo -h >/dev/null 2>&1; then
        log "already running"
        cat "$STATE/env.sh"; return 0
    fi
    [[ $(id -u) == 0 ]] || { log "must run as root (daemons switch users; packages are installed with apt)"; return 1; }
    [[ -d "$PIDS" ]] && stop
    rm -rf "$STATE"
    mkdir -p "$STATE"
    install_packages
    local t0=$SECONDS
    write_configs
    if ! { start_munge && start_mariadb && start_slurm; }; then
        log "start failed; logs follow"
        tail -n 20 "$LOGS"/*.log "$LOGS"/*.out "$STATE/mysql-run/mariadbd.log" >&2 2>/dev/null || true
        stop
        return 1
    fi
    log "cluster $CLUSTER up in $((SECONDS - t0))s (state $STATE)"
    cat "$STATE/env.sh"
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) status ;;
    *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
