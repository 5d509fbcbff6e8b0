#!/usr/bin/env bash
# A real SLURM 22.05 cluster (munge, MariaDB, slurmdbd, slurmctld, one slurmd per node) for
# tests/integration/test_slurm.py and tests/integration/test_slurm_nodes.py, started by hand (no systemd) as root.
#
# MARIN_SLURM_NODES=N (default 1) gives N nodes. Node 0 is this host (its own name); nodes 1..N-1
# are network namespaces `marin-PORT-nI`, each with its own host name (`unshare --uts`) and
# address on a private bridge (MARIN_SLURM_SUBNET, default 10.213.0: this host .1, node I .(I+1)),
# each running its own slurmd under its own NodeName. munged is shared (its socket is a file).
# With N > 1, slurmctld listens on the bridge address, so every node and every srun reaches it,
# and a topology.conf groups MARIN_SLURM_NODES_PER_RACK nodes (default 1) per "rack" switch.
#
#   bash .ci/slurm.sh start    # install if absent, start, wait until sinfo and sacct answer,
#                              # print `export SLURM_CONF=...` and write it to $STATE/env.sh
#   bash .ci/slurm.sh stop     # kill the daemons this script started, by their recorded PIDs
#   bash .ci/slurm.sh status   # daemons alive? sinfo
#   bash .ci/slurm.sh kill-node I    # node I >= 1 fails: SIGKILL its slurmd and every process in its
#                                    # network namespace (its job steps), as a crashed host
#   bash .ci/slurm.sh start-node I   # start node I's slurmd again; wait until it is back in service
#
# State (configs, spool, MariaDB datadir, logs, PIDs) lives under MARIN_SLURM_DIR
# (default /tmp/marin-slurm). A second cluster runs beside the first with its own MARIN_SLURM_DIR,
# MARIN_SLURM_PORT (slurmctld; slurmd and slurmdbd take the next two) and MARIN_SLURM_DB_PORT;
# munged is shared. MARIN_SLURM_MAX_ARRAY_SIZE sets MaxArraySize (default 4: a 6-run test study goes in as two arrays). A fresh `start` wipes it; FirstJobId is taken from the clock so job
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
NODES="${MARIN_SLURM_NODES:-1}"
# status/stop/kill-node of a running cluster: its own node count unless told
if [[ -z "${MARIN_SLURM_NODES:-}" && "${1:-}" != start && -f "$CONF" ]]; then NODES=$(grep -c '^NodeName=' "$CONF"); fi
NODES_PER_RACK="${MARIN_SLURM_NODES_PER_RACK:-1}"
SUBNET="${MARIN_SLURM_SUBNET:-10.213.0}"
BRIDGE="msbr$CTLD_PORT"   # interface names: at most 15 characters
[[ "$NODES" =~ ^[1-9][0-9]?$ ]] && (( NODES <= 16 )) \
    || { echo "slurm.sh: MARIN_SLURM_NODES=$NODES; allowed values: 1..16" >&2; exit 2; }
[[ "$NODES_PER_RACK" =~ ^[1-9][0-9]?$ ]] \
    || { echo "slurm.sh: MARIN_SLURM_NODES_PER_RACK=$NODES_PER_RACK; allowed values: 1..99" >&2; exit 2; }
if (( NODES > 1 )); then CTLD_ADDR="$SUBNET.1"; else CTLD_ADDR=127.0.0.1; fi
# the daemons, in start order; stop goes in reverse (slurmd-I: node I's slurmd)
DAEMONS=(munged mariadbd slurmdbd slurmctld)
for (( i = 0; i < NODES; i++ )); do DAEMONS+=("slurmd-$i"); done

node_name() { if (( $1 == 0 )); then echo "$HOST"; else echo "marin-n$1"; fi; }
netns_name() { echo "marin-$CTLD_PORT-n$1"; }

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
    # the nodes share this machine's memory: each is given its share
    mem_mb=$(awk -v n="$NODES" '/MemTotal/ {print int($2 / 1024 * 0.85 / n)}' /proc/meminfo)
    mkdir -p "$STATE/etc" "$STATE/ctld" "$STATE/spool" "$PIDS" "$LOGS"
    cat >"$CONF" <<EOF
ClusterName=$CLUSTER
SlurmctldHost=$HOST($CTLD_ADDR)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
AuthType=auth/munge
# a requeued job waits cred_expire (default 120 s) before it may start again; short for tests
AuthInfo=cred_expire=10
StateSaveLocation=$STATE/ctld
# per node (%n: the NodeName): several slurmd share this file system
SlurmdSpoolDir=$STATE/spool/%n
SlurmctldPidFile=$STATE/slurmctld.pidfile
SlurmdPidFile=$STATE/slurmd-%n.pidfile
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd-%n.log
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
# a node that stops answering is DOWN after this long, and its jobs are requeued (JobRequeue=1)
SlurmdTimeout=${MARIN_SLURMD_TIMEOUT:-20}
ReturnToService=2
InactiveLimit=0
KillWait=10
MinJobAge=600
# small, so tests/integration/test_slurm.py can submit a study larger than one array (SLURM's default is 1001)
MaxArraySize=${MARIN_SLURM_MAX_ARRAY_SIZE:-4}
FirstJobId=$(( $(date +%s) % 50000000 + 1000 ))
JobRequeue=1
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$DBD_PORT
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
$(nodes_conf "$cpus" "$mem_mb")
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
    if (( NODES > 1 )); then topology_conf >"$STATE/etc/topology.conf"; fi
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

nodes_conf() {  # nodes_conf CPUS MEM_MB: the NodeName lines (and the topology plugin for N > 1)
    local i
    if (( NODES == 1 )); then
        echo "NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$1 RealMemory=$2 State=UNKNOWN"; return
    fi
    echo "TopologyPlugin=topology/tree"
    for (( i = 0; i < NODES; i++ )); do
        echo "NodeName=$(node_name $i) NodeAddr=$SUBNET.$((i + 1)) CPUs=$1 RealMemory=$2 State=UNKNOWN"
    done
}

topology_conf() {  # racks of NODES_PER_RACK nodes under one top switch
    local i r racks=$(( (NODES + NODES_PER_RACK - 1) / NODES_PER_RACK )) names
    for (( r = 0; r < racks; r++ )); do
        names=()
        for (( i = r * NODES_PER_RACK; i < NODES && i < (r + 1) * NODES_PER_RACK; i++ )); do names+=("$(node_name $i)"); done
        echo "SwitchName=rack$r Nodes=$(IFS=,; echo "${names[*]}")"
    done
    echo "SwitchName=top Switches=rack[0-$((racks - 1))]"
}

start_network() {
    # a bridge on this host (node 0's address) and per extra node a namespace joined by a veth pair;
    # every name is recorded before it is made, so stop removes it after a failed start too
    # (errexit is off inside `start`'s condition: each step returns on failure itself)
    local i ns veth
    (( NODES > 1 )) || return 0
    echo "link $BRIDGE" >>"$STATE/net" || return 1
    ip link add "$BRIDGE" type bridge || return 1
    ip addr add "$SUBNET.1/24" dev "$BRIDGE" || return 1
    ip link set "$BRIDGE" up || return 1
    for (( i = 1; i < NODES; i++ )); do
        ns=$(netns_name $i); veth="msv${CTLD_PORT}n$i"
        echo "netns $ns" >>"$STATE/net" || return 1
        ip netns add "$ns" || return 1
        echo "link $veth" >>"$STATE/net" || return 1
        ip link add "$veth" type veth peer name eth0 netns "$ns" || return 1
        ip link set "$veth" master "$BRIDGE" up || return 1
        ip netns exec "$ns" ip addr add "$SUBNET.$((i + 1))/24" dev eth0 || return 1
        ip netns exec "$ns" ip link set eth0 up || return 1
        ip netns exec "$ns" ip link set lo up || return 1
    done
}


stop_network() {
    local kind name
    [[ -f "$STATE/net" ]] || return 0
    # reverse order: namespaces (their veth ends go with them) before the bridge
    tac "$STATE/net" | while read -r kind name; do
        case $kind in
            netns) ip netns del "$name" 2>/dev/null || true ;;
            link) ip link del "$name" 2>/dev/null || true ;;
        esac
    done
    rm -f "$STATE/net"
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
    wait_for 60 mariadbd mariadb --no-defaults --socket="$sock" -u root -e 'SELECT 1' || return 1
    mariadb --no-defaults --socket="$sock" -u root <<'EOF'
CREATE USER IF NOT EXISTS 'slurm'@'%' IDENTIFIED BY 'marin-slurm';
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'%';
FLUSH PRIVILEGES;
EOF
}

start_slurmd() {  # start_slurmd I: node I's slurmd (node 0 on this host, others in their namespace)
    local i=$1 name
    name=$(node_name "$i")
    mkdir -p "$STATE/spool/$name"
    if (( i == 0 )); then
        slurmd -D -f "$CONF" -N "$name" >>"$LOGS/slurmd-$name.out" 2>&1 </dev/null &
    else
        # nsenter enters only the network namespace (`ip netns exec` would remount /sys and
        # hide the cgroup file system slurmd needs); nsenter and unshare exec, so $! is slurmd
        nsenter --net="/run/netns/$(netns_name "$i")" unshare --uts \
            bash -c 'hostname "$1"; shift; exec "$@"' _ "$name" slurmd -D -f "$CONF" -N "$name" \
            >>"$LOGS/slurmd-$name.out" 2>&1 </dev/null &
    fi
    echo $! >"$PIDS/slurmd-$i.pid"
}

node_index() {  # node_index I: I if it names an extra node of this cluster, else fail
    [[ "${1:-}" =~ ^[0-9]+$ ]] && (( $1 >= 1 && $1 < $(grep -c '^NodeName=' "$CONF") )) \
        || { log "node index ${1:-?}; allowed values: 1..$(( $(grep -c '^NodeName=' "$CONF") - 1 )) (extra nodes)"; return 1; }
}

kill_node() {
    local i=$1 ino pid pids round
    node_index "$i" || return 1
    ino=$(stat -L -c %i "/run/netns/$(netns_name "$i")")
    # every process in that namespace (found by its inode, never by name) stops at once, as a host
    # that loses power: nothing of it can report to slurmctld; then they are killed
    for round in 1 2; do
        pids=()
        for pid in /proc/[0-9]*; do
            [[ "$(stat -L -c %i "$pid/ns/net" 2>/dev/null)" == "$ino" ]] && pids+=("${pid#/proc/}")
        done
        (( ${#pids[@]} )) && { kill -STOP "${pids[@]}" 2>/dev/null || true; }
    done
    (( ${#pids[@]} )) && { kill -KILL "${pids[@]}" 2>/dev/null || true; }
    log "node $(node_name "$i") killed (${#pids[@]} processes)"
}

start_node() {
    local i=$1
    node_index "$i" || return 1
    export SLURM_CONF="$CONF"
    alive "slurmd-$i" || start_slurmd "$i"
    wait_for 90 "slurmd-$i" bash -c "sinfo -h -n $(node_name "$i") -o %T | grep -Eqx 'idle|mixed|allocated'"
}

start_slurm() {
    export SLURM_CONF="$CONF"
    slurmdbd -D >"$LOGS/slurmdbd.out" 2>&1 </dev/null &
    echo $! >"$PIDS/slurmdbd.pid"
    wait_for 60 slurmdbd sacctmgr -n list cluster || return 1
    sacctmgr -i add cluster "$CLUSTER" >/dev/null 2>&1 || true
    slurmctld -D -f "$CONF" >"$LOGS/slurmctld.out" 2>&1 </dev/null &
    echo $! >"$PIDS/slurmctld.pid"
    wait_for 60 slurmctld scontrol ping || return 1
    local i
    for (( i = 0; i < NODES; i++ )); do start_slurmd "$i"; done
    for (( i = 0; i < NODES; i++ )); do
        wait_for 60 "slurmd-$i" bash -c "sinfo -h -n $(node_name $i) -o %T | grep -qx idle" || return 1
    done
    wait_for 60 sacct sacct -n -X
}

stop() {
    local name pid jobs f
    # cancel our cluster's jobs first, so their processes end with their steps
    if alive slurmctld; then
        jobs=$(SLURM_CONF="$CONF" squeue -h -o %A 2>/dev/null | sort -u | tr '\n' ' ' || true)
        if [[ -n "${jobs// }" ]]; then
            # shellcheck disable=SC2086
            SLURM_CONF="$CONF" scancel $jobs 2>/dev/null || true
            for _ in $(seq 50); do
                [[ -z "$(SLURM_CONF="$CONF" squeue -h -o %A 2>/dev/null)" ]] && break; sleep 0.2
            done
        fi
    fi
    # every slurmd this state dir recorded (whatever MARIN_SLURM_NODES is now), then the rest in reverse
    local order=()
    for f in "$PIDS"/slurmd*.pid; do [[ -e "$f" ]] && order+=("$(basename "$f" .pid)"); done
    order+=(slurmctld slurmdbd mariadbd munged)
    for name in "${order[@]}"; do
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
    stop_network
}

all_slurmd_alive() {
    local i
    for (( i = 0; i < NODES; i++ )); do alive "slurmd-$i" || return 1; done
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
    if [[ -f "$CONF" ]] && alive slurmctld && alive slurmdbd && all_slurmd_alive \
        && [[ $(grep -c '^NodeName=' "$CONF") == "$NODES" ]] && SLURM_CONF="$CONF" sinfo -h >/dev/null 2>&1; then
        log "already running"
        cat "$STATE/env.sh"; return 0
    fi
    [[ $(id -u) == 0 ]] || { log "must run as root (daemons switch users; packages are installed with apt)"; return 1; }
    if [[ -d "$PIDS" || -f "$STATE/net" ]]; then stop; fi
    rm -rf "$STATE"
    mkdir -p "$STATE"
    install_packages
    local t0=$SECONDS
    write_configs
    if ! { start_network && start_munge && start_mariadb && start_slurm; }; then
        log "start failed; logs follow"
        tail -n 20 "$LOGS"/*.log "$LOGS"/*.out "$STATE/mysql-run/mariadbd.log" >&2 2>/dev/null || true
        stop
        return 1
    fi
    log "cluster $CLUSTER up in $((SECONDS - t0))s: $NODES node(s) (state $STATE)"
    cat "$STATE/env.sh"
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) status ;;
    kill-node) kill_node "${2:-}" ;;
    start-node) start_node "${2:-}" ;;
    *) echo "usage: $0 start|stop|status|kill-node I|start-node I" >&2; exit 2 ;;
esac
