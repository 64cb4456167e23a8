#!/usr/bin/env bash
# bench/run.sh: fulcrum side by side with a direct connection, HAProxy, nginx
# and a naive Go io.Copy proxy, all on 127.0.0.1 (issues 7 and 26). It prints
# Markdown tables of medians and ratios and appends them to bench/RESULTS.md.
#
#   bench/run.sh              full run: both passes (pinned, then unpinned), 3 repetitions each, 5 s per workload
#   QUICK=1 bench/run.sh      the same, shorter: 1 s per workload, 4,000 idle connections
#   PIN=1 bench/run.sh        the pinned pass only (the one the targets are read from)
#
# Environment (all optional):
#   REPS=3  DUR=5 (whole seconds)  WARM=1 (seconds, may be fractional)  IDLE=9000
#   PIN=both | 1 | 0: the passes. 1, pinned: each proxy alone on PROXY_CPUS with one thread per CPU there
#     (HAProxy nbthread, nginx worker_processes, fulcrum GOMAXPROCS and so its loops), and every client,
#     backend and server on LOAD_CPUS (taskset), so that a proxy gets exactly its cores. 0, unpinned: as
#     before issue 26, everything shares every CPU, HAProxy and nginx with 2 threads, fulcrum with its
#     loops as the old default gave them (one per two CPUs). both (the default): pinned, then unpinned.
#   PROXY_CPUS=1  LOAD_CPUS=0 (taskset -c lists; on a larger host e.g. PROXY_CPUS=8-15 LOAD_CPUS=0-7)
#   UNPINNED_LOOPS=(CPUs / 2): fulcrum's (and the naive proxy's) GOMAXPROCS in the unpinned pass
#   SYSCALLS=1: after the repetitions of a pass, one more of every workload with the proxy's system calls
#     counted (perf stat on the raw_syscalls tracepoint, else strace -c -f), kept out of the medians
#     because counting slows the proxy; perf or strace: that tool; 0: no syscall counts
#   TARGETS="direct haproxy nginx naive fulcrum"
#     (also "other": another fulcrum binary, OTHER=path, labelled OTHER_LABEL, for an A/B run)
#   WORKLOADS="bulk1 bulk4 conn pp1 pp32 open50 open80 idle pg pgprep pgrows maria rget rpipe rnew rlist rhash scale"
#     open50, open80: 64 B messages on 32 connections offered at a fixed rate (open loop, latency from
#     each message's due time), 50% and 80% of the best of HAProxy's and nginx's pp32 rate in the same
#     repetition (so they come after pp32)
#     pg: pgbench -S, 16 persistent clients, against a PostgreSQL 15 it initdb's and starts itself;
#     pgprep: pgbench -S -M prepared (the extended protocol, prepared statements), 32 clients;
#     pgrows: a pgbench script that reads 100 rows of pgbench_accounts (about 12 KB a reply), 100 clients;
#     maria: sysbench oltp_read_only, 16 threads, against a MariaDB it installs and starts itself;
#     rget: redis-benchmark -t get -c 50; rpipe: the same with -P 32 -d 1024; rnew: with -k 0
#     (a new connection per request); rlist: LRANGE of a 100-element list of 64 B values (about 7 KB a
#     reply), 100 clients; rhash: HGETALL of a 32-field hash of 64 B values (about 2.5 KB), 100 clients;
#     against a redis-server it starts itself
#     scale: fulcrum only (fulcrum, other): the connection-rate run again in a fulcrum of its own with
#     3, 1,000 and 10,000 backends, and with 3 while SCALE_IDLE idle connections are held (the cost as
#     the work grows; a table of its own)
#   SCALE_IDLE=8900 (QUICK 4000): idle connections held during one of the scale runs
#   PORT_BASE=21000 (uses PORT_BASE+1 … PORT_BASE+506; all below 32768)   RECORD=0 (do not append to RESULTS.md)
#   KEEP=1 (keep the work directory with configs, logs and raw outputs)   NOTE="…" (a line for RESULTS.md)
#   QUIET_S=3: seconds of /proc/stat read before the run; over 10 % busy, the entry says "shared machine"
#   With TARGETS holding both fulcrum and other, the report adds a paired table: other ÷ fulcrum
#   within each repetition, how often other was better, and the sign test's p (an A/B of two builds)
#
# Everything it starts runs in its own process group and is stopped on exit,
# Ctrl-C or failure. Missing HAProxy, nginx (with its stream module), iperf3,
# jq, PostgreSQL, Redis, MariaDB or sysbench are installed with apt-get (as root).
set -euo pipefail
export LC_ALL=C

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

# The command as given, for RESULTS.md: the knobs set in the environment, then the script.
CMDLINE=""
for v in QUICK PIN PROXY_CPUS LOAD_CPUS UNPINNED_LOOPS SYSCALLS REPS DUR WARM IDLE SCALE_IDLE TARGETS WORKLOADS PORT_BASE OTHER_LABEL; do
	if [[ -n ${!v:-} ]]; then
		printf -v q '%q' "${!v}"
		CMDLINE+="$v=$q "
	fi
done
CMDLINE+="bench/run.sh"

if [[ ${QUICK:-0} == 1 ]]; then
	: "${REPS:=3}" "${DUR:=1}" "${WARM:=0.2}" "${IDLE:=4000}" "${SETTLE:=0.5}" "${OPEN_BUDGET:=20}" "${SCALE_IDLE:=4000}"
else
	: "${REPS:=3}" "${DUR:=5}" "${WARM:=1}" "${IDLE:=9000}" "${SETTLE:=2}" "${OPEN_BUDGET:=90}" "${SCALE_IDLE:=8900}"
fi
read -r -a TARGETS <<<"${TARGETS:-direct haproxy nginx naive fulcrum}"
ALL_WORKLOADS="bulk1 bulk4 conn pp1 pp32 open50 open80 idle pg pgprep pgrows maria rget rpipe rnew rlist rhash scale"
read -r -a WORKLOADS <<<"${WORKLOADS:-$ALL_WORKLOADS}"
PORT_BASE=${PORT_BASE:-21000}
[[ $DUR =~ ^[1-9][0-9]*$ ]] || { echo "bench: DUR must be whole seconds (iperf3 -t), got $DUR" >&2; exit 2; }
PIN=${PIN:-both} PROXY_CPUS=${PROXY_CPUS:-1} LOAD_CPUS=${LOAD_CPUS:-0} SYSCALLS=${SYSCALLS:-1}
UNPINNED_LOOPS=${UNPINNED_LOOPS:-$(($(nproc) / 2 > 0 ? $(nproc) / 2 : 1))}
[[ $UNPINNED_LOOPS =~ ^[1-9][0-9]*$ ]] || { echo "bench: UNPINNED_LOOPS must be a positive count, got $UNPINNED_LOOPS" >&2; exit 2; }
case $PIN in
both) PASSES=(pinned unpinned) ;;
1) PASSES=(pinned) ;;
0) PASSES=(unpinned) ;;
*) echo "bench: PIN must be both, 1 or 0, got $PIN" >&2; exit 2 ;;
esac

WORK=$(mktemp -d "${TMPDIR:-/tmp}/fulcrum-bench.XXXXXX")
BIN=$WORK/bin RAW=$WORK/raw LOG=$WORK/log
mkdir -p "$BIN" "$RAW" "$LOG" "$WORK/pid" "$WORK/nginx"
SAMPLES=$WORK/samples.tsv
: >"$SAMPLES"
declare -A PID=() # name → pid of a process we started; each leads its own process group
CLIENT=""         # the load client running in the foreground, if any
REP=0             # the repetition, 1 … REPS; 0 in the syscall pass
RL=0              # its label in the samples: 1, 2, … pinned, u1, u2, … unpinned; s and us the syscall passes
LOADPIN=()        # the taskset prefix of clients and backends in this pass, if pinned
PROXYPIN=()       # the same for the proxies

say() { printf '%s %s\n' "$(date +%T)" "$*" >&2; }
warn() { say "WARNING: $*"; }
fail() {
	say "FAILED: $*"
	KEEP=1
	exit 1
}
have() { command -v "$1" >/dev/null 2>&1; }

# ---------------------------------------------------------------- processes

cleanup() {
	local rc=$? name
	trap - EXIT INT TERM
	[[ -n $CLIENT ]] && kill -TERM "$CLIENT" 2>/dev/null
	[[ -n ${SYS_PID:-} ]] && kill -INT "$SYS_PID" 2>/dev/null
	for name in "${!PID[@]}"; do stop "$name"; done
	[[ -n ${TW_SET:-} ]] && { echo "$TW_SET" >"$TW_FILE" || warn "could not restore net.ipv4.tcp_max_tw_buckets to $TW_SET"; }
	if [[ ${KEEP:-0} == 1 || ($rc != 0 && $rc != 130 && $rc != 143) ]]; then
		say "work directory kept: $WORK"
	else
		rm -rf "$WORK"
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# start NAME CMD…: run CMD in the background in a new session (its own process
# group, so that stop reaches its children too), output appended to
# $LOG/NAME.{out,err} (a restarted proxy keeps its earlier log).
start() {
	local name=$1
	shift
	setsid "$@" >>"$LOG/$name.out" 2>>"$LOG/$name.err" </dev/null &
	PID[$name]=$!
	echo "$!" >"$WORK/pid/$name.pid"
}

# gone PID: the process has exited (or is a zombie waiting for us to reap it).
gone() {
	local st
	st=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
	st=${st##*) }
	[[ ${st%% *} == Z ]]
}

alive() { [[ -n ${PID[$1]:-} ]] && ! gone "${PID[$1]}"; }

# stop NAME: SIGTERM to its process group, SIGKILL after 5 s, then reap.
stop() {
	local name=$1 pid=${PID[$1]:-} i
	[[ -n $pid ]] || return 0
	unset "PID[$name]"
	kill -TERM -- "-$pid" 2>/dev/null || true
	for ((i = 0; i < 100; i++)); do
		gone "$pid" && break
		sleep 0.05
	done
	kill -KILL -- "-$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
}

listening() { [[ -n $(ss -Hltn "sport = :$1") ]]; }

# listening_by NAME PORT: one of NAME's processes listens on PORT (where ss
# cannot say whose a socket is, as for another user's without root: anyone),
# so that a socket of someone else's on the port cannot pass for NAME's. A
# short run on a shared machine once counted 1,440 refused connects at the
# start of a scale run, whose client (by the times in the logs) had started
# before that fulcrum listened; whose socket ss saw then is not known.
listening_by() {
	local line p
	line=$(ss -Hltnp "sport = :$2" 2>/dev/null)
	[[ -n $line ]] || return 1
	[[ $line == *pid=* ]] || return 0
	for p in $(pids "$1"); do [[ $line == *"pid=$p,"* ]] && return 0; done
	return 1
}

# wait_listen NAME PORT…: poll until NAME listens on every port (15 s at most).
wait_listen() {
	local name=$1 p deadline=$((SECONDS + 15))
	shift
	for p in "$@"; do
		until listening_by "$name" "$p"; do
			alive "$name" || fail "$name exited at start: $(tail -n 5 "$LOG/$name.err")"
			((SECONDS < deadline)) || fail "$name does not listen on port $p within 15 s"
			sleep 0.05
		done
	done
}

# client OUT LIMIT CMD…: run a load client with a time bound, stdout to OUT.
# It runs in the background so that Ctrl-C interrupts the wait at once.
client() {
	local out=$1 limit=$2 rc=0
	shift 2
	timeout -k 2 "$limit" "${LOADPIN[@]}" "$@" >"$out" 2>>"$LOG/clients.err" &
	CLIENT=$!
	wait "$CLIENT" || rc=$?
	CLIENT=""
	return "$rc"
}

# pids NAME: the processes of NAME's group (nginx: master and workers).
pids() { pgrep -g "${PID[$1]}" || true; }

# cpu_ticks NAME: utime+stime of NAME's processes, in clock ticks.
cpu_ticks() {
	local p st sum=0 f=()
	for p in $(pids "$1"); do
		st=$(cat "/proc/$p/stat" 2>/dev/null) || continue
		read -r -a f <<<"${st##*) }" # f[0] is field 3 (state): utime is field 14, stime 15
		sum=$((sum + f[11] + f[12]))
	done
	echo "$sum"
}

# rss_kib NAME: VmRSS summed over NAME's processes.
rss_kib() {
	local p sum=0 kb
	for p in $(pids "$1"); do
		kb=$(awk '/^VmRSS:/ {print $2}' "/proc/$p/status" 2>/dev/null) || continue
		sum=$((sum + ${kb:-0}))
	done
	echo "$sum"
}

# fds NAME: open descriptors summed over NAME's processes.
fds() {
	local p sum=0 n
	for p in $(pids "$1"); do
		n=$(find "/proc/$p/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)
		sum=$((sum + n))
	done
	echo "$sum"
}

# ---------------------------------------------------------------- tools

export PATH=$PATH:/usr/local/go/bin
for t in go ss setsid timeout pgrep getconf; do
	have "$t" || fail "$t is needed and missing"
done

# cpu_stat LIST: busy and total jiffies of the CPUs in LIST (a taskset -c
# list; "all": every CPU) from /proc/stat; busy is all but idle and iowait.
cpu_stat() {
	awk -v list="$1" 'BEGIN {
			n = split(list, parts, ",")
			for (i = 1; i <= n; i++)
				if (split(parts[i], r, "-") == 2) { for (c = r[1] + 0; c <= r[2] + 0; c++) want["cpu" c] = 1 } else want["cpu" parts[i]] = 1
		}
		$1 in want || list == "all" && $1 ~ /^cpu[0-9]/ { t = 0; for (i = 2; i <= 9; i++) t += $i; busy += t - $5 - $6; total += t }
		END { print busy + 0, total + 0 }' /proc/stat
}

# cpu_count LIST: how many CPUs a taskset -c list names (0-3,8 → 5).
cpu_count() {
	local n=0 r parts=()
	IFS=, read -r -a parts <<<"$1"
	for r in "${parts[@]}"; do
		if [[ $r == *-* ]]; then n=$((n + ${r#*-} - ${r%-*} + 1)); else n=$((n + 1)); fi
	done
	echo "$n"
}
CORES=$(nproc)
NPROXY=$(cpu_count "$PROXY_CPUS")
if [[ " ${PASSES[*]} " == *" pinned "* ]]; then
	have taskset || fail "PIN needs taskset (util-linux)"
	taskset -c "$PROXY_CPUS" true 2>/dev/null || fail "PROXY_CPUS=$PROXY_CPUS is not a CPU list this machine can run on"
	taskset -c "$LOAD_CPUS" true 2>/dev/null || fail "LOAD_CPUS=$LOAD_CPUS is not a CPU list this machine can run on"
fi

nginx_stream() { # how nginx has its stream module: static, dynamic or none
	local v
	v=$(nginx -V 2>&1)
	case $v in
	*--with-stream=dynamic*) echo dynamic ;;
	*--with-stream\ * | *--with-stream) echo static ;;
	*) echo none ;;
	esac
}
nginx_modules() { nginx -V 2>&1 | tr ' ' '\n' | sed -n 's/^--modules-path=//p'; }

PG_BIN=/usr/lib/postgresql/15/bin
wants() { [[ " ${WORKLOADS[*]} " == *" $1 "* ]]; }
wants_pg() { wants pg || wants pgprep || wants pgrows; }
wants_redis() { wants rget || wants rpipe || wants rnew || wants rlist || wants rhash; }

install_missing() {
	local pkgs=()
	have haproxy || pkgs+=(haproxy)
	have nginx || pkgs+=(nginx libnginx-mod-stream)
	if have nginx && [[ $(nginx_stream) == dynamic && ! -e $(nginx_modules)/ngx_stream_module.so ]]; then
		pkgs+=(libnginx-mod-stream) # Debian ships the stream module as its own package
	fi
	have iperf3 || pkgs+=(iperf3)
	have jq || pkgs+=(jq)
	if wants_pg; then
		have pgbench || pkgs+=(postgresql-client-15)
		[[ -x $PG_BIN/initdb ]] || pkgs+=(postgresql-15)
	fi
	if wants_redis; then
		have redis-server || pkgs+=(redis-server)
		have redis-benchmark || pkgs+=(redis-tools)
	fi
	# The syscall counts: perf with its tracepoints where it works, strace otherwise.
	[[ $SYSCALLS == 1 || $SYSCALLS == strace ]] && ! have perf && ! have strace && pkgs+=(strace)
	if wants maria; then
		have mariadbd || [[ -x /usr/sbin/mariadbd ]] || pkgs+=(mariadb-server)
		have mariadb || pkgs+=(mariadb-client)
		have sysbench || pkgs+=(sysbench)
	fi
	((${#pkgs[@]})) || return 0
	[[ $(id -u) == 0 ]] || fail "missing ${pkgs[*]}; install them (apt-get install -y ${pkgs[*]}) or run as root"
	have apt-get || fail "missing ${pkgs[*]} and there is no apt-get to install them"
	say "installing ${pkgs[*]}"
	export DEBIAN_FRONTEND=noninteractive
	if ! apt-get install -y -q "${pkgs[@]}" >"$LOG/apt.log" 2>&1; then
		apt-get update -q >>"$LOG/apt.log" 2>&1 || true
		apt-get install -y -q "${pkgs[@]}" >>"$LOG/apt.log" 2>&1 ||
			fail "apt-get install ${pkgs[*]} failed: $(tail -n 3 "$LOG/apt.log")"
	fi
}
install_missing
for t in haproxy nginx iperf3 jq; do have "$t" || fail "$t is still missing after installing"; done
[[ $(nginx_stream) != none ]] || fail "this nginx has no stream module (nginx -V shows no --with-stream)"

# The syscall pass counts with perf stat on the raw_syscalls tracepoint
# (cheap: the kernel counts), else with strace -c -f (every syscall stops the
# proxy: only the counts mean anything then), else not at all.
SYS_TOOL=""
SYS_WAITS=syscalls:sys_enter_epoll_wait,syscalls:sys_enter_epoll_pwait
perf_works() { have perf && perf stat -x, -o /dev/null -e raw_syscalls:sys_enter -e "$SYS_WAITS" true 2>/dev/null; }
case $SYSCALLS in
0) ;;
1)
	if perf_works; then
		SYS_TOOL=perf
	elif have strace; then
		SYS_TOOL=strace
	else
		warn "SYSCALLS=1 but neither perf (with the raw_syscalls tracepoint) nor strace works here: no syscall counts"
	fi
	;;
perf) perf_works && SYS_TOOL=perf || fail "SYSCALLS=perf, but perf stat -e raw_syscalls:sys_enter does not work here" ;;
strace) have strace && SYS_TOOL=strace || fail "SYSCALLS=strace, but there is no strace" ;;
*) fail "SYSCALLS must be 1, 0, perf or strace, got $SYSCALLS" ;;
esac

# How busy the machine is before the run, by anyone, from /proc/stat over
# QUIET_S seconds (all CPUs; busy is all but idle and iowait). The load
# average said so before, but it is the last minutes' queue, not now: a
# run that started right after another was called shared though nothing ran
# beside it.
QUIET_S=${QUIET_S:-3}
read -r Q_B0 Q_T0 < <(cpu_stat all)
sleep "$QUIET_S"
read -r Q_B1 Q_T1 < <(cpu_stat all)
BUSY_BEFORE=$(awk -v b=$((Q_B1 - Q_B0)) -v t=$((Q_T1 - Q_T0)) 'BEGIN { printf "%.0f", (t > 0 ? 100 * b / t : 0) }')

say "building fulcrum and the load tools"
REV=$(git describe --always --dirty 2>/dev/null || echo unknown) # GOFLAGS may hold -buildvcs=false
go build -ldflags "-X main.version=$REV" -o "$BIN/" . ./bench/tcpload ./bench/naive ./bench/report || fail "go build failed"

CPU_MODEL=$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)
MEM_GIB=$(awk '/^MemTotal:/ {printf "%.0f", $2 / 1048576}' /proc/meminfo)
KERNEL=$(uname -r)
GO_V=$(go env GOVERSION)
HAPROXY_V=$(haproxy -v | sed -n '1s/^HA-*Proxy version \([^ ]*\).*/\1/p')
NGINX_V=$(nginx -v 2>&1 | sed 's|.*nginx/||')
IPERF_V=$(iperf3 -v | awk 'NR == 1 {print $2}')
FULCRUM_V=$("$BIN/fulcrum" -version | awk 'NR == 1 {print $2}')
NOFILE=$(ulimit -Hn)
CLK_TCK=$(getconf CLK_TCK)
LOAD_BEFORE=$(cut -d' ' -f1 /proc/loadavg)

# TIME_WAIT. The connection workloads leave tens of thousands of sockets in
# TIME_WAIT, all between 127.0.0.1 and a few ports. Past
# net.ipv4.tcp_max_tw_buckets (131,072 on a 24 GiB machine) the kernel stops
# keeping them, and for the minute until those expire a new connection costs
# every target much less (HAProxy under redis-benchmark -k 0: 38 µs of CPU
# per connection and 23,800/s with the table full, 61-78 µs and 13,900-15,200/s
# otherwise): a target's figures depended on what ran just before it. So the
# run raises the limit out of reach (root only), and gives it back at exit.
TW_FILE=/proc/sys/net/ipv4/tcp_max_tw_buckets TW_WANT=1048576
TW_WAS=$(cat "$TW_FILE" 2>/dev/null) || TW_WAS=""
TW_SET=""
if [[ -n $TW_WAS ]] && ((TW_WAS < TW_WANT)); then
	if [[ $(id -u) == 0 ]] && echo "$TW_WANT" >"$TW_FILE" 2>/dev/null; then
		TW_SET=$TW_WAS
		say "net.ipv4.tcp_max_tw_buckets raised from $TW_WAS to $TW_WANT for the run"
	else
		warn "net.ipv4.tcp_max_tw_buckets is $TW_WAS and cannot be raised: the connection rows will depend on what ran before them"
	fi
fi
TW_NOW=$(cat "$TW_FILE" 2>/dev/null || echo unknown)

# ---------------------------------------------------------------- addresses and configs

P_ECHO=($((PORT_BASE + 1)) $((PORT_BASE + 2)) $((PORT_BASE + 3)))
P_IPERF=$((PORT_BASE + 10))
P_PG=$((PORT_BASE + 20))
P_REDIS=$((PORT_BASE + 21))
P_MARIA=$((PORT_BASE + 22))
declare -A FRONT=() IFRONT=() PGFRONT=() RFRONT=() SFRONT=() MFRONT=() # a proxy's ports for the echo backends, iperf3, PostgreSQL, Redis, scale, MariaDB
for t in haproxy nginx naive fulcrum other; do
	case $t in haproxy) p=$((PORT_BASE + 101)) ;; nginx) p=$((PORT_BASE + 201)) ;; naive) p=$((PORT_BASE + 301)) ;; fulcrum) p=$((PORT_BASE + 401)) ;; other) p=$((PORT_BASE + 501)) ;; esac
	FRONT[$t]=$p
	IFRONT[$t]=$((p + 1))
	PGFRONT[$t]=$((p + 2))
	RFRONT[$t]=$((p + 3))
	SFRONT[$t]=$((p + 4)) # scale: fulcrum's own process with many backends
	MFRONT[$t]=$((p + 5))
done
ECHO_ADDRS="127.0.0.1:${P_ECHO[0]},127.0.0.1:${P_ECHO[1]},127.0.0.1:${P_ECHO[2]}"

echo_addr() { if [[ $1 == direct ]]; then echo "$ECHO_ADDRS"; else echo "127.0.0.1:${FRONT[$1]}"; fi; }
iperf_port() { if [[ $1 == direct ]]; then echo "$P_IPERF"; else echo "${IFRONT[$1]}"; fi; }
pg_port() { if [[ $1 == direct ]]; then echo "$P_PG"; else echo "${PGFRONT[$1]}"; fi; }
redis_port() { if [[ $1 == direct ]]; then echo "$P_REDIS"; else echo "${RFRONT[$1]}"; fi; }
maria_port() { if [[ $1 == direct ]]; then echo "$P_MARIA"; else echo "${MFRONT[$1]}"; fi; }

for t in "${TARGETS[@]}"; do
	[[ $t == direct || -n ${FRONT[$t]:-} ]] || fail "unknown target $t (direct haproxy nginx naive fulcrum other)"
	[[ $t != other || -x ${OTHER:-} ]] || fail "target other needs OTHER=path to a fulcrum binary"
done
for p in "${P_ECHO[@]}" "$P_IPERF" "$P_PG" "$P_REDIS" "$P_MARIA" "${FRONT[@]}" "${IFRONT[@]}" "${PGFRONT[@]}" "${RFRONT[@]}" "${SFRONT[@]}" "${MFRONT[@]}"; do
	listening "$p" && fail "port $p is already in use; choose other ports with PORT_BASE"
done

# haproxy_cfg THREADS: HAProxy with THREADS threads, kernel splicing when it
# pays, connection limits that fit the descriptor limit: 2 per connection plus
# 2 per pipe must stay under $NOFILE (9,900 × 2 + 64 × 2 + listeners = 19,938
# < 20,000).
haproxy_cfg() {
	cat <<EOF
global
    nbthread $1
    maxconn 9900
    maxpipes 64
    pidfile $WORK/pid/haproxy.pidfile
defaults
    mode tcp
    option splice-auto
    maxconn 9900
    timeout connect 5s
    timeout client 1h
    timeout server 1h
frontend echo
    bind 127.0.0.1:${FRONT[haproxy]}
    default_backend echo
backend echo
    balance roundrobin
    server echo1 127.0.0.1:${P_ECHO[0]}
    server echo2 127.0.0.1:${P_ECHO[1]}
    server echo3 127.0.0.1:${P_ECHO[2]}
frontend iperf
    bind 127.0.0.1:${IFRONT[haproxy]}
    default_backend iperf
backend iperf
    server iperf 127.0.0.1:$P_IPERF
frontend pg
    bind 127.0.0.1:${PGFRONT[haproxy]}
    default_backend pg
backend pg
    server pg 127.0.0.1:$P_PG
frontend redis
    bind 127.0.0.1:${RFRONT[haproxy]}
    default_backend redis
backend redis
    server redis 127.0.0.1:$P_REDIS
frontend maria
    bind 127.0.0.1:${MFRONT[haproxy]}
    default_backend maria
backend maria
    server maria 127.0.0.1:$P_MARIA
EOF
}

# nginx_conf WORKERS: the stream module, WORKERS workers, one listening
# socket per worker (reuseport); a worker counts client and upstream
# connections against worker_connections, and each worker has its own
# $NOFILE descriptors.
nginx_conf() {
	[[ $(nginx_stream) == dynamic ]] && echo "load_module $(nginx_modules)/ngx_stream_module.so;"
	cat <<EOF
daemon off;
master_process on;
worker_processes $1;
worker_rlimit_nofile $NOFILE;
pid $WORK/pid/nginx.pidfile;
error_log stderr warn;
events {
    worker_connections $((NOFILE - 1000));
}
stream {
    upstream echo {
        server 127.0.0.1:${P_ECHO[0]};
        server 127.0.0.1:${P_ECHO[1]};
        server 127.0.0.1:${P_ECHO[2]};
    }
    upstream iperf {
        server 127.0.0.1:$P_IPERF;
    }
    proxy_connect_timeout 5s;
    proxy_timeout 1h;
    server {
        listen 127.0.0.1:${FRONT[nginx]} reuseport;
        proxy_pass echo;
    }
    server {
        listen 127.0.0.1:${IFRONT[nginx]} reuseport;
        proxy_pass iperf;
    }
    server {
        listen 127.0.0.1:${PGFRONT[nginx]} reuseport;
        proxy_pass 127.0.0.1:$P_PG;
    }
    server {
        listen 127.0.0.1:${RFRONT[nginx]} reuseport;
        proxy_pass 127.0.0.1:$P_REDIS;
    }
    server {
        listen 127.0.0.1:${MFRONT[nginx]} reuseport;
        proxy_pass 127.0.0.1:$P_MARIA;
    }
}
EOF
}

# fulcrum_toml TARGET [LINE]: round robin, no access log, the same backends,
# on TARGET's ports; LINE is added to [defaults].
fulcrum_toml() {
	local t=$1
	cat <<EOF
[log]
level  = "info"
format = "json"
access = false

[defaults]
scheduler       = "rr"
connect_timeout = "5s"
retries         = 2
drain_timeout   = "1s"
${2:-}

[services.echo]
listen   = ["127.0.0.1:${FRONT[$t]}"]
backends = [
  { name = "echo1", address = "127.0.0.1:${P_ECHO[0]}" },
  { name = "echo2", address = "127.0.0.1:${P_ECHO[1]}" },
  { name = "echo3", address = "127.0.0.1:${P_ECHO[2]}" },
]

[services.iperf]
listen   = ["127.0.0.1:${IFRONT[$t]}"]
backends = [{ name = "iperf", address = "127.0.0.1:$P_IPERF" }]

[services.pg]
listen   = ["127.0.0.1:${PGFRONT[$t]}"]
backends = [{ name = "pg", address = "127.0.0.1:$P_PG" }]

[services.redis]
listen   = ["127.0.0.1:${RFRONT[$t]}"]
backends = [{ name = "redis", address = "127.0.0.1:$P_REDIS" }]

[services.maria]
listen   = ["127.0.0.1:${MFRONT[$t]}"]
backends = [{ name = "maria", address = "127.0.0.1:$P_MARIA" }]
EOF
}
fulcrum_toml fulcrum >"$WORK/fulcrum.toml"
# other: the same for another fulcrum binary, on its own ports.
fulcrum_toml other >"$WORK/other.toml"

# One configuration of each per pass: pinned, a thread per proxy CPU; unpinned,
# two threads as in every run before issue 26.
for pass in "${PASSES[@]}"; do
	n=2
	[[ $pass == pinned ]] && n=$NPROXY
	haproxy_cfg "$n" >"$WORK/haproxy-$pass.cfg"
	nginx_conf "$n" >"$WORK/nginx-$pass.conf"
	haproxy -c -f "$WORK/haproxy-$pass.cfg" >"$LOG/haproxy-check.log" 2>&1 || fail "haproxy -c: $(tail -n 5 "$LOG/haproxy-check.log")"
	nginx -t -c "$WORK/nginx-$pass.conf" -p "$WORK/nginx/" -e stderr >"$LOG/nginx-check.log" 2>&1 || fail "nginx -t: $(tail -n 5 "$LOG/nginx-check.log")"
done
for f in fulcrum other; do
	"$BIN/fulcrum" -check -config "$WORK/$f.toml" >"$LOG/$f-check.log" 2>&1 || fail "fulcrum -check $f.toml: $(cat "$LOG/$f-check.log")"
done

start_proxy() {
	local t=$1 e=127.0.0.1:${P_ECHO[0]},127.0.0.1:${P_ECHO[1]},127.0.0.1:${P_ECHO[2]}
	case $t in
	haproxy) start haproxy "${PROXYPIN[@]}" haproxy -db -f "$WORK/haproxy-$PASS.cfg" ;;
	nginx) start nginx "${PROXYPIN[@]}" nginx -c "$WORK/nginx-$PASS.conf" -p "$WORK/nginx/" -e stderr ;;
	naive) start naive env GOMAXPROCS="$PROCS" "${PROXYPIN[@]}" "$BIN/naive" "127.0.0.1:${FRONT[naive]}=$e" \
		"127.0.0.1:${IFRONT[naive]}=127.0.0.1:$P_IPERF" "127.0.0.1:${PGFRONT[naive]}=127.0.0.1:$P_PG" \
		"127.0.0.1:${RFRONT[naive]}=127.0.0.1:$P_REDIS" "127.0.0.1:${MFRONT[naive]}=127.0.0.1:$P_MARIA" ;;
	fulcrum) start fulcrum env GOMAXPROCS="$PROCS" "${PROXYPIN[@]}" "$BIN/fulcrum" -config "$WORK/fulcrum.toml" ;;
	other) start other env GOMAXPROCS="$PROCS" "${PROXYPIN[@]}" "$OTHER" -config "$WORK/other.toml" ;;
	esac
	wait_listen "$t" "${FRONT[$t]}" "${IFRONT[$t]}" "${PGFRONT[$t]}" "${RFRONT[$t]}" "${MFRONT[$t]}"
}

# set_pass PASS: the pinning, thread counts and sample labels of PASS (pinned or
# unpinned). fulcrum (and the naive proxy) get GOMAXPROCS, and fulcrum an
# event loop per P: pinned, one per proxy CPU; unpinned, one per two CPUs,
# the default of every run before issue 26 (fulcrum's default is now a loop
# per usable CPU: docs/operations.md), so that the unpinned table goes on
# from the earlier ones.
set_pass() {
	PASS=$1
	if [[ $PASS == pinned ]]; then
		LOADPIN=(taskset -c "$LOAD_CPUS") PROXYPIN=(taskset -c "$PROXY_CPUS") PROCS=$NPROXY LP="" PCPUS=$NPROXY LOAD_SET=$LOAD_CPUS PROXY_SET=$PROXY_CPUS
	else
		LOADPIN=() PROXYPIN=() PROCS=$UNPINNED_LOOPS LP=u PCPUS=$CORES LOAD_SET=0-$((CORES - 1)) PROXY_SET=0-$((CORES - 1))
	fi
}

# repin: the servers (and all their threads) to LOAD_CPUS when pinned, to
# every CPU when not; the processes and threads they start later inherit it.
# The echo backends are restarted instead (start_echo).
repin() {
	local name p cpus=0-$((CORES - 1))
	[[ $PASS == pinned ]] && cpus=$LOAD_CPUS
	for name in iperf3 pg redis maria; do
		[[ -n ${PID[$name]:-} ]] || continue
		for p in $(pids "$name"); do taskset -a -p -c "$cpus" "$p" >/dev/null 2>&1 || true; done
	done
}

# smoke TARGET [ADDR]: connections through TARGET (or ADDR) must echo
# before anything is measured.
smoke() {
	local out=$RAW/smoke-$1.json
	client "$out" 20 "$BIN/tcpload" -mode pingpong -addr "${2:-$(echo_addr "$1")}" -c 3 -d 200ms -warmup 0s ||
		fail "$1: the smoke test failed to run"
	[[ $(jq '.errors' "$out") == 0 && $(jq '.ops' "$out") -gt 0 ]] || fail "$1 does not echo: $(cat "$out")"
}

# start_pg: a PostgreSQL 15 cluster of its own in $WORK/pg, on 127.0.0.1:$P_PG,
# with pgbench's tables at scale 1. PostgreSQL refuses to run as root: then
# it runs as the postgres user.
start_pg() {
	local as=()
	if [[ $(id -u) == 0 ]]; then
		chmod 711 "$WORK"
		as=(runuser -u postgres --)
	fi
	mkdir -p "$WORK/pg"
	[[ $(id -u) == 0 ]] && chown postgres "$WORK/pg"
	"${as[@]}" "$PG_BIN/initdb" -D "$WORK/pg/data" -A trust -U postgres --no-sync >"$LOG/initdb.log" 2>&1 ||
		fail "initdb: $(tail -n 5 "$LOG/initdb.log")"
	start pg "${as[@]}" "$PG_BIN/postgres" -D "$WORK/pg/data" -p "$P_PG" -c listen_addresses=127.0.0.1 \
		-c unix_socket_directories="$WORK/pg" -c fsync=off -c synchronous_commit=off -c max_connections=200 \
		-c shared_buffers=128MB
	wait_listen pg "$P_PG"
	local i
	for ((i = 0; i < 100; i++)); do
		pgbench -i -q -s 1 -h 127.0.0.1 -p "$P_PG" -U postgres postgres >"$LOG/pgbench-init.log" 2>&1 && return 0
		sleep 0.1 # listening before it accepts logins
	done
	fail "pgbench -i: $(tail -n 5 "$LOG/pgbench-init.log")"
}

# ---------------------------------------------------------------- workloads

sample() { printf '%s\t%s\t%s\t%s\n' "$RL" "$1" "$2" "$3" >>"$SAMPLES"; }

# record TARGET PREFIX FILE KEY=JSONFIELD…: samples from a tcpload JSON line,
# plus one PREFIX_error:KIND sample per kind of failure (one jq call).
record() {
	local t=$1 k=$2 file=$3 key v
	shift 3
	jq -r --arg k "$k" --arg kv "$*" '. as $r
		| ([$kv | split(" ")[] | split("=") | [.[0], $r[.[1]]]]
		   + [(.error_kinds // {}) | to_entries[] | [$k + "_error:" + .key, .value]])[]
		| select(.[1] != null) | "\(.[0])\t\(.[1])"' "$file" |
		while IFS=$'\t' read -r key v; do sample "$t" "$key" "$v"; done
}

# meter_start NAME: NAME's CPU ticks, the load CPUs' and the time, before a
# measured run; in a syscall pass it also starts counting NAME's system calls.
meter_start() {
	M_NAME=$1 M_C0=$(cpu_ticks_of "$1") M_T0=${EPOCHREALTIME/./}
	read -r M_LB0 M_LT0 < <(cpu_stat "$LOAD_SET")
	read -r M_PB0 M_PT0 < <(cpu_stat "$PROXY_SET")
	[[ $RL == *s ]] && sys_start "$1"
	return 0
}

# meter_stop TARGET KEY: after the run, samples KEY_cpu_ticks and KEY_wall_us
# (for the CPU per operation and how busy the proxy's CPUs were), KEY_load_busy
# (the share of LOAD_SET's CPUs busy over the run, by anyone), KEY_pcpu_busy
# (the same of PROXY_SET's: on a quiet machine, pinned, the proxy's own share), and in a
# syscall pass KEY_sys and KEY_sysw (all system calls, and the epoll waits
# among them).
meter_stop() {
	local t=$1 k=$2 c1 t1 lb lt pb pt
	c1=$(cpu_ticks_of "$M_NAME") t1=${EPOCHREALTIME/./}
	read -r lb lt < <(cpu_stat "$LOAD_SET")
	read -r pb pt < <(cpu_stat "$PROXY_SET")
	sys_stop "$t" "$k"
	((lt > M_LT0)) && sample "$t" "${k}_load_busy" "$(awk -v b=$((lb - M_LB0)) -v t=$((lt - M_LT0)) 'BEGIN { printf "%.1f", 100 * b / t }')"
	((pt > M_PT0)) && sample "$t" "${k}_pcpu_busy" "$(awk -v b=$((pb - M_PB0)) -v t=$((pt - M_PT0)) 'BEGIN { printf "%.1f", 100 * b / t }')"
	[[ $t == direct ]] && return 0
	sample "$t" "${k}_cpu_ticks" $((c1 - M_C0))
	sample "$t" "${k}_wall_us" $((t1 - M_T0))
}

# sys_start NAME: count the system calls of NAME's processes (every thread
# they have now) until sys_stop.
sys_start() {
	local list p args=()
	SYS_PID=""
	[[ $1 == direct || -z $SYS_TOOL ]] && return 0
	list=$(pids "$1" | paste -sd, -)
	[[ -n $list ]] || return 0
	case $SYS_TOOL in
	perf) perf stat -x, -o "$WORK/sys.out" -e raw_syscalls:sys_enter -e "$SYS_WAITS" -p "$list" 2>>"$LOG/perf.err" & ;;
	strace)
		for p in ${list//,/ }; do args+=(-p "$p"); done
		strace -c -f -q -o "$WORK/sys.out" "${args[@]}" 2>>"$LOG/strace.err" &
		;;
	esac
	SYS_PID=$!
	sleep 0.3 # neither says when it has attached; the client has not started yet
}

# sys_stop TARGET KEY: stop counting; samples KEY_sys and KEY_sysw.
sys_stop() {
	local total waits
	[[ -n ${SYS_PID:-} ]] || return 0
	case $SYS_TOOL in perf) kill -INT "$SYS_PID" ;; strace) kill -TERM "$SYS_PID" ;; esac 2>/dev/null
	wait "$SYS_PID" 2>/dev/null || true
	SYS_PID=""
	case $SYS_TOOL in
	perf) read -r total waits < <(awk -F, '$3 == "raw_syscalls:sys_enter" {t = $1} $3 ~ /sys_enter_epoll_p?wait$/ {w += $1} END {print t + 0, w + 0}' "$WORK/sys.out") ;;
	strace) read -r total waits < <(awk '$NF == "total" {t = $4} $NF ~ /^epoll_(p?wait|pwait2)$/ {w += $4} END {print t + 0, w + 0}' "$WORK/sys.out") ;;
	esac
	if ((total > 0)); then
		sample "$1" "${2}_sys" "$total"
		sample "$1" "${2}_sysw" "$waits"
	fi
}

# bulk TARGET STREAMS KEY: iperf3 through TARGET; proxy CPU over the run.
bulk() {
	local t=$1 n=$2 k=$3 out=$RAW/$RL-$1-$3.json ok
	for _ in 1 2; do
		meter_start "$t"
		ok=0
		client "$out" $((DUR + 30)) iperf3 -c 127.0.0.1 -p "$(iperf_port "$t")" -t "$DUR" -P "$n" -J --connect-timeout 5000 && ok=1
		if ((ok)); then
			meter_stop "$t" "$k"
			jq -r '.end.sum_received | "\(.bits_per_second) \(.bytes)"' "$out" | {
				read -r bps bytes
				sample "$t" "${k}_bps" "$bps"
				sample "$t" "${k}_bytes" "$bytes"
			}
			return 0
		fi
		sys_stop "$t" "$k"
		# The iperf3 server takes a moment to be ready for the next test.
		grep -q busy "$out" 2>/dev/null && sleep 1 && continue
		break
	done
	warn "$t $k: iperf3 failed: $(jq -r '.error // empty' "$out" 2>/dev/null | head -c 200)"
	sample "$t" "${k}_failed" 1
}

cpu_ticks_of() { if [[ $1 == direct ]]; then echo 0; else cpu_ticks "$1"; fi; }

# conn TARGET: connection rate with 32 clients; proxy CPU over the run.
conn() {
	local t=$1 out=$RAW/$RL-$1-conn.json rc=0
	meter_start "$t"
	client "$out" $((DUR + 40)) "$BIN/tcpload" -mode connrate -addr "$(echo_addr "$t")" -c 32 -size 64 -d "${DUR}s" -warmup "${WARM}s" || rc=$?
	meter_stop "$t" conn
	if ((rc == 0)); then
		record "$t" conn "$out" conn_rate=ops_per_s conn_total=ops_total
	else
		warn "$t conn: tcpload failed"
		sample "$t" conn_failed 1
	fi
}

# pp TARGET CONNS KEY: 64 B request/response on CONNS persistent connections.
pp() {
	local t=$1 c=$2 k=$3 out=$RAW/$RL-$1-$3.json rc=0
	meter_start "$t"
	client "$out" $((DUR + 40)) "$BIN/tcpload" -mode pingpong -addr "$(echo_addr "$t")" -c "$c" -size 64 -d "${DUR}s" -warmup "${WARM}s" || rc=$?
	meter_stop "$t" "$k"
	if ((rc == 0)); then
		record "$t" "$k" "$out" "${k}_rate=ops_per_s" "${k}_total=ops_total" "${k}_p50_us=p50_us" "${k}_p99_us=p99_us" "${k}_p999_us=p999_us"
	else
		warn "$t $k: tcpload failed"
		sample "$t" "${k}_failed" 1
	fi
}

# peak: the best closed-loop pp32 rate of HAProxy and nginx in this
# repetition (of any proxy if neither ran), or nothing.
peak() {
	awk -F'\t' -v rep="$RL" '$1 == rep && $3 == "pp32_rate" && $2 != "direct" {
		if ($2 == "haproxy" || $2 == "nginx") { if ($4 > peer) peer = $4 } else if ($4 > any) any = $4 }
		END { r = peer ? peer : any; if (r) printf "%d\n", r }' "$SAMPLES"
}

# open TARGET PERCENT KEY: the open loop at PERCENT of peak.
open() {
	local t=$1 pct=$2 k=$3 out=$RAW/$RL-$1-$3.json rate rc=0
	rate=$(peak)
	if [[ -z $rate ]]; then
		warn "$t $k: no pp32 rate in this repetition to take $pct% of (run pp32 first)"
		sample "$t" "${k}_failed" 1
		return 0
	fi
	rate=$((rate * pct / 100))
	meter_start "$t"
	client "$out" $((DUR + 40)) "$BIN/tcpload" -mode openloop -addr "$(echo_addr "$t")" -c 32 -rate "$rate" -size 64 -d "${DUR}s" -warmup "${WARM}s" || rc=$?
	meter_stop "$t" "$k"
	if ((rc == 0)); then
		record "$t" "$k" "$out" "${k}_rate=ops_per_s" "${k}_total=ops_total" "${k}_offered=offered_per_s" "${k}_p50_us=p50_us" "${k}_p99_us=p99_us" "${k}_p999_us=p999_us"
	else
		warn "$t $k: tcpload failed"
		sample "$t" "${k}_failed" 1
	fi
}

# pg TARGET KEY ARGS…: pgbench with ARGS for DUR seconds; tps, transactions
# and proxy CPU over the run under KEY.
pg() {
	local t=$1 k=$2 out=$RAW/$RL-$1-$2.txt tps n rc=0
	shift 2
	meter_start "$t"
	client "$out" $((DUR + 30)) pgbench -n -T "$DUR" -h 127.0.0.1 -p "$(pg_port "$t")" -U postgres "$@" postgres || rc=$?
	meter_stop "$t" "$k"
	if ((rc == 0)); then
		tps=$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' "$out" | tail -n 1)
		n=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$out")
		if [[ -n $tps && -n $n ]]; then
			sample "$t" "${k}_tps" "$tps"
			sample "$t" "${k}_ops" "$n"
			return 0
		fi
	fi
	warn "$t $k: pgbench failed: $(tail -n 2 "$out" "$LOG/clients.err" 2>/dev/null | head -c 300)"
	sample "$t" "${k}_failed" 1
}

# maria TARGET: sysbench oltp_read_only (14 queries a transaction: point
# selects, ranges, a sum, an order by, a distinct) with 16 threads for DUR
# seconds; transactions per second and proxy CPU over the run.
maria() {
	local t=$1 out=$RAW/$RL-$1-maria.txt tps n rc=0
	meter_start "$t"
	client "$out" $((DUR + 30)) sysbench oltp_read_only "${SYSBENCH[@]}" --mysql-port="$(maria_port "$t")" \
		--threads=16 --time="$DUR" --report-interval=0 run || rc=$?
	meter_stop "$t" maria
	if ((rc == 0)); then
		read -r n tps < <(sed -n 's/^ *transactions: *\([0-9]*\) *(\([0-9.]*\) per sec.*/\1 \2/p' "$out")
		if [[ -n ${tps:-} && -n ${n:-} ]]; then
			sample "$t" maria_tps "$tps"
			sample "$t" maria_ops "$n"
			return 0
		fi
	fi
	warn "$t maria: sysbench failed: $(tail -n 3 "$out" 2>/dev/null | head -c 300)"
	sample "$t" maria_failed 1
}

# redis TARGET KEY REQUESTS ARGS…: redis-benchmark with ARGS (options, then
# -t tests or a command); its first test's requests/s and proxy CPU over the
# run. REQUESTS is per second of DUR (redis-benchmark runs a count, not a
# duration).
redis() {
	local t=$1 k=$2 n=$(($3 * DUR)) out=$RAW/$RL-$1-$2.csv rps rc=0
	shift 3
	meter_start "$t"
	client "$out" $((DUR * 5 + 30)) redis-benchmark -h 127.0.0.1 -p "$(redis_port "$t")" -n "$n" --csv "$@" || rc=$?
	meter_stop "$t" "$k"
	if ((rc == 0)); then
		rps=$(awk -F'"' 'NR == 2 {print $4}' "$out")
		if [[ -n $rps ]]; then
			sample "$t" "${k}_rps" "$rps"
			sample "$t" "${k}_ops" "$n"
			return 0
		fi
	fi
	warn "$t $k: redis-benchmark failed: $(tail -n 2 "$out" 2>/dev/null | head -c 300)"
	sample "$t" "${k}_failed" 1
}

# redis_data: the values rlist and rhash read, set once, directly: list
# (LRANGE 0 99: 100 values of 64 B, a reply of about 7 KB) and hash (HGETALL:
# 32 fields of 64 B, about 2.5 KB). GET's key is set before each GET
# workload, to 3 bytes (rget, rnew) or 1,024 (rpipe).
redis_set() { redis-cli -h 127.0.0.1 -p "$P_REDIS" "$@" >/dev/null || fail "redis-cli $1 failed"; }
redis_value() { head -c "$1" /dev/zero | tr '\0' x; }
redis_data() {
	local v i f=()
	v=$(redis_value 64)
	redis_set del list hash
	for ((i = 0; i < 100; i++)); do f+=("$v"); done
	redis_set rpush list "${f[@]}"
	f=()
	for ((i = 0; i < 32; i++)); do f+=("field$i" "$v"); done
	redis_set hset hash "${f[@]}"
}

# idle TARGET: a fresh proxy, then $IDLE connections opened, pinged and held;
# RSS and descriptors before and $SETTLE s after all are up; a final ping of
# each. The proxy is restarted again afterwards so that the next workload
# does not run among the remains of thousands of connections.
idle() {
	local t=$1 name=idle-$RL-$1 ready=$WORK/idle.ready r0 f0 r1 f1 deadline out rc=0
	[[ $t == direct ]] && return 0
	stop "$t"
	start_proxy "$t"
	r0=$(rss_kib "$t") f0=$(fds "$t")
	rm -f "$ready"
	start "$name" "${LOADPIN[@]}" "$BIN/tcpload" -mode idle -addr "$(echo_addr "$t")" -c "$IDLE" -size 64 -par 512 -timeout 1s \
		-open-budget "${OPEN_BUDGET}s" -hold 10m -ready "$ready"
	deadline=$((SECONDS + OPEN_BUDGET + 30))
	until [[ -e $ready ]]; do
		alive "$name" || break
		((SECONDS < deadline)) || break
		sleep 0.1
	done
	if [[ -e $ready ]]; then
		sleep "$SETTLE" # as the spike did: let the proxy settle before reading its RSS
		r1=$(rss_kib "$t") f1=$(fds "$t")
		kill -USR1 "${PID[$name]}" 2>/dev/null || true
	fi
	deadline=$((SECONDS + 30))
	while alive "$name" && ((SECONDS < deadline)); do sleep 0.1; done
	wait "${PID[$name]}" 2>/dev/null || rc=$?
	stop "$name"
	out=$LOG/$name.out
	if [[ -n ${r1:-} && $rc == 0 && -s $out ]]; then
		cp "$out" "$RAW/$RL-$t-idle.json"
		record "$t" idle "$out" idle_asked=asked idle_alive=alive idle_held=held
		sample "$t" idle_rss0_kib "$r0"
		sample "$t" idle_rss1_kib "$r1"
		sample "$t" idle_fds0 "$f0"
		sample "$t" idle_fds1 "$f1"
	else
		warn "$t idle: tcpload idle failed (status $rc): $(tail -n 3 "$LOG/$name.err")"
		sample "$t" idle_failed 1
	fi
	stop "$t"
	start_proxy "$t"
}

# scale TARGET: fulcrum's cost as the work grows. The connection-rate run
# (32 clients) again, in a fulcrum of its own on SFRONT whose one service has
# 3, 1,000 and 10,000 backends (the three echo backends' addresses again and
# again, each under its own name: round robin meets every one), and with 3
# backends while SCALE_IDLE idle connections are held. Proxy CPU per new
# connection and the connection's latency as the client sees it (connect,
# 64 B echo, close), which holds the pick and the dial. Other targets skip it.
# The idle connections come to a second address of the service, 127.0.0.2:
# held from 127.0.0.1 to the very address the 32 clients connect to, they
# make each of the clients' connects search the ephemeral ports past them
# (the kernel's __inet_hash_connect), which doubled the client's system time
# and halved the rate: the row then measured the load generator.
#
# The four runs start one further along each repetition, as the targets do.
# Run in one fixed order (3, 1,000, 10,000 backends, then idle), the CPU per
# connection rose with the position in two full runs (46.9, 47.0, 48.9, 50.2
# µs; 48.0, 51.2, 53.5, 53.6), where by hand, interleaved, 3 and 10,000
# backends cost the same (52–56 µs against 49–55); each run's own figures
# move by ±10% (51.8 to 63.7 µs in one 4-repetition run), so that no run
# should always hold the same place.
scale() {
	local t=$1 bin v runs=(3 1000 10000 idle)
	case $t in fulcrum) bin=$BIN/fulcrum ;; other) bin=$OTHER ;; *) return 0 ;; esac
	for v in "${runs[@]:REP % ${#runs[@]}}" "${runs[@]:0:REP % ${#runs[@]}}"; do
		case $v in
		idle) scale_run "$t" "$bin" 3 scaleidle "$SCALE_IDLE" ;;
		*) scale_run "$t" "$bin" "$v" "scale$v" 0 ;;
		esac
	done
}

# scale_toml PORT N: one service on PORT of 127.0.0.1 and 127.0.0.2 with N
# backends, fulcrum's defaults.
scale_toml() {
	local port=$1 n=$2 i
	printf '[log]\nlevel = "info"\nformat = "json"\naccess = false\n\n[services.scale]\nlisten = ["127.0.0.1:%s", "127.0.0.2:%s"]\nbackends = [\n' "$port" "$port"
	for ((i = 0; i < n; i++)); do
		printf '  { name = "b%d", address = "127.0.0.1:%s" },\n' "$i" "${P_ECHO[i % 3]}"
	done
	printf ']\n'
}

# scale_run TARGET BIN N KEY IDLE: one scale measurement, samples under KEY.
scale_run() {
	local t=$1 bin=$2 n=$3 k=$4 idle=$5 name=scale-$1 holder=scale-idle-$1 port=${SFRONT[$1]}
	local out=$RAW/$RL-$1-$4.json ready=$WORK/scale-idle.ready deadline rc=0 crc=0
	scale_toml "$port" "$n" >"$WORK/scale-$t-$n.toml"
	start "$name" env GOMAXPROCS="$PROCS" "${PROXYPIN[@]}" "$bin" -config "$WORK/scale-$t-$n.toml"
	wait_listen "$name" "$port"
	smoke "$name" "127.0.0.1:$port"
	if ((idle > 0)); then
		rm -f "$ready"
		start "$holder" "${LOADPIN[@]}" "$BIN/tcpload" -mode idle -addr "127.0.0.2:$port" -c "$idle" -size 64 -par 512 -timeout 1s \
			-open-budget "${OPEN_BUDGET}s" -hold 10m -ready "$ready"
		deadline=$((SECONDS + OPEN_BUDGET + 30))
		until [[ -e $ready ]] || ! alive "$holder" || ((SECONDS >= deadline)); do sleep 0.1; done
		[[ -e $ready ]] || warn "$t $k: the idle connections did not open: $(tail -n 3 "$LOG/$holder.err")"
	fi
	meter_start "$name"
	client "$out" $((DUR + 40)) "$BIN/tcpload" -mode connrate -addr "127.0.0.1:$port" -c 32 -size 64 -d "${DUR}s" -warmup "${WARM}s" || crc=$?
	meter_stop "$t" "$k"
	if ((crc == 0)); then
		record "$t" "$k" "$out" "${k}_rate=ops_per_s" "${k}_total=ops_total" "${k}_p50_us=p50_us" "${k}_p99_us=p99_us"
	else
		warn "$t $k: tcpload failed"
		sample "$t" "${k}_failed" 1
	fi
	if ((idle > 0)) && alive "$holder"; then
		kill -USR1 "${PID[$holder]}" 2>/dev/null || true # the final ping, then its result
		deadline=$((SECONDS + 30))
		while alive "$holder" && ((SECONDS < deadline)); do sleep 0.1; done
		wait "${PID[$holder]}" 2>/dev/null || rc=$?
		if [[ $rc == 0 && -s $LOG/$holder.out ]]; then
			tail -n 1 "$LOG/$holder.out" >"$RAW/$RL-$t-$k-held.json"
			record "$t" "$k" "$RAW/$RL-$t-$k-held.json" "${k}_held=alive"
		fi
	fi
	stop "$holder"
	stop "$name"
}

# start_maria: a MariaDB of its own in $WORK/maria on 127.0.0.1:$P_MARIA, a
# user sbtest and sysbench's table (one of 10,000 rows), InnoDB without
# durability (as PostgreSQL runs with fsync off). As root it runs as the
# mysql user.
SYSBENCH=(--db-driver=mysql --mysql-host=127.0.0.1 --mysql-user=sbtest --mysql-password=sbtest --mysql-db=sbtest
	--tables=1 --table-size=10000)
start_maria() {
	local d=$WORK/maria user=() auth=normal mariadbd=/usr/sbin/mariadbd i
	have mariadbd && mariadbd=$(command -v mariadbd)
	mkdir -p "$d"
	if [[ $(id -u) == 0 ]]; then
		chmod 711 "$WORK"
		chown mysql:mysql "$d"
		user=(--user=mysql) auth=socket
	fi
	mariadb-install-db --no-defaults --datadir="$d/data" "${user[@]}" --auth-root-authentication-method=$auth \
		--skip-test-db --skip-name-resolve >"$LOG/maria-install.log" 2>&1 || fail "mariadb-install-db: $(tail -n 5 "$LOG/maria-install.log")"
	start maria "$mariadbd" --no-defaults --datadir="$d/data" "${user[@]}" --port="$P_MARIA" --bind-address=127.0.0.1 \
		--socket="$d/sock" --pid-file="$d/pid" --log-error="$d/err.log" --skip-log-bin --skip-name-resolve \
		--max-connections=500 --innodb-buffer-pool-size=128M --skip-innodb-doublewrite --innodb-flush-log-at-trx-commit=0
	wait_listen maria "$P_MARIA"
	for ((i = 0; i < 100; i++)); do
		mariadb --no-defaults -S "$d/sock" -u root -e "CREATE DATABASE IF NOT EXISTS sbtest; CREATE USER IF NOT EXISTS sbtest@'%' IDENTIFIED BY 'sbtest'; GRANT ALL ON sbtest.* TO sbtest@'%'" \
			>"$LOG/maria-init.log" 2>&1 && break
		sleep 0.1 # listening before it accepts logins
	done
	sysbench oltp_read_only "${SYSBENCH[@]}" --mysql-port="$P_MARIA" prepare >>"$LOG/maria-init.log" 2>&1 ||
		fail "sysbench prepare: $(tail -n 5 "$LOG/maria-init.log")"
}

# start_echo: the three echo backends, (re)started in each pass so that the Go
# runtime sizes itself to the CPUs they may use (taskset -p would move them,
# but leave them with a P per CPU they no longer have).
start_echo() {
	local i
	for i in 0 1 2; do
		stop "echo$((i + 1))"
		start "echo$((i + 1))" "${LOADPIN[@]}" "$BIN/tcpload" -mode echo -listen "127.0.0.1:${P_ECHO[i]}"
	done
	for i in 0 1 2; do wait_listen "echo$((i + 1))" "${P_ECHO[i]}"; done
}

say "starting an iperf3 server and the servers the workloads need"
start iperf3 iperf3 -s -B 127.0.0.1 -p "$P_IPERF"
wait_listen iperf3 "$P_IPERF"
wants_pg && start_pg
if wants_redis; then
	start redis redis-server --port "$P_REDIS" --bind 127.0.0.1 --save '' --appendonly no --protected-mode no
	wait_listen redis "$P_REDIS"
	redis_data
fi
wants maria && start_maria

# pgrows: 100 rows of pgbench_accounts a transaction (at scale 1 it has
# 100,000), about 12 KB of DataRow messages.
cat >"$WORK/pgrows.sql" <<'EOF'
\set a random(1, 99900)
SELECT * FROM pgbench_accounts WHERE aid BETWEEN :a AND :a + 99;
EOF

# run_workload W TARGET: one workload against one target.
run_workload() {
	local w=$1 t=$2
	case $w in
	bulk1) bulk "$t" 1 bulk1 ;;
	bulk4) bulk "$t" 4 bulk4 ;;
	conn) conn "$t" ;;
	pp1) pp "$t" 1 pp1 ;;
	pp32) pp "$t" 32 pp32 ;;
	open50) open "$t" 50 open50 ;;
	open80) open "$t" 80 open80 ;;
	idle) idle "$t" ;;
	pg) pg "$t" pg -S -c 16 -j 2 ;;
	pgprep) pg "$t" pgprep -S -M prepared -c 32 -j 2 ;;
	pgrows) pg "$t" pgrows -f "$WORK/pgrows.sql" -M prepared -c 100 -j 2 ;;
	maria) maria "$t" ;;
	rget)
		redis_set set key:__rand_int__ "$(redis_value 3)"
		redis "$t" rget 30000 -c 50 -t get
		;;
	rpipe)
		redis_set set key:__rand_int__ "$(redis_value 1024)"
		redis "$t" rpipe 400000 -c 50 -P 32 -t get
		;;
	rnew)
		redis_set set key:__rand_int__ "$(redis_value 3)"
		redis "$t" rnew 5000 -c 50 -k 0 -t get
		;;
	rlist) redis "$t" rlist 8000 -c 100 lrange list 0 99 ;;
	rhash) redis "$t" rhash 15000 -c 100 hgetall hash ;;
	scale) scale "$t" ;;
	*) fail "unknown workload $w ($ALL_WORKLOADS)" ;;
	esac
}

for w in "${WORKLOADS[@]}"; do [[ " $ALL_WORKLOADS " == *" $w "* ]] || fail "unknown workload $w ($ALL_WORKLOADS)"; done
say "measuring: passes ${PASSES[*]}, ${REPS} repetitions each of ${WORKLOADS[*]} (${DUR} s each after ${WARM} s warm-up; ${IDLE} idle connections)${SYS_TOOL:+, then one with syscalls counted by $SYS_TOOL}"
START=$SECONDS
for p in "${PASSES[@]}"; do
	set_pass "$p"
	for t in "${TARGETS[@]}"; do [[ $t == direct ]] || stop "$t"; done
	start_echo
	repin
	for t in "${TARGETS[@]}"; do
		[[ $t == direct ]] || start_proxy "$t"
		smoke "$t"
	done
	last=$REPS
	[[ -n $SYS_TOOL ]] && last=$((REPS + 1))
	for ((REP = 1; REP <= last; REP++)); do
		RL=$LP$REP
		((REP > REPS)) && RL=${LP}s REP=0 # the syscall pass, kept out of the medians
		for t in "${TARGETS[@]}"; do sample "$t" proxy_cpus "$PCPUS"; done
		# Round robin over the targets within each workload, starting one further
		# along each repetition, so that no target always runs first or last.
		order=("${TARGETS[@]:REP % ${#TARGETS[@]}}" "${TARGETS[@]:0:REP % ${#TARGETS[@]}}")
		for w in "${WORKLOADS[@]}"; do
			[[ $RL == *s && ($w == idle || $w == scale) ]] && continue
			say "$PASS, repetition $RL of $REPS: $w"
			for t in "${order[@]}"; do run_workload "$w" "$t"; done
		done
		((REP == 0)) && break
	done
done
ELAPSED=$((SECONDS - START))
LOAD_AFTER=$(cut -d' ' -f1 /proc/loadavg)

# ---------------------------------------------------------------- the table

declare -A LABEL=()
LABEL[direct]=direct
LABEL[haproxy]="HAProxy ${HAPROXY_V%%-*}" # 2.6.12, without Debian's package revision
LABEL[nginx]="nginx $NGINX_V"
LABEL[naive]="naive Go io.Copy"
LABEL[fulcrum]=fulcrum
LABEL[other]="fulcrum ${OTHER_LABEL:-other}"
cols=""
for t in "${TARGETS[@]}"; do cols+="${cols:+,}$t=${LABEL[$t]}"; done
"$BIN/report" -samples "$SAMPLES" -targets "$cols" -clk-tck "$CLK_TCK" >"$WORK/table.md" || fail "report failed"

shared=""
if ((BUSY_BEFORE > 10)); then
	shared="Taken on a shared machine: other work was running (its CPUs $BUSY_BEFORE % busy in the $QUIET_S s before the run), so figures are noisy."
fi
{
	echo "## $(date -u '+%Y-%m-%d %H:%M UTC') · \`$CMDLINE\`"
	echo
	echo "- machine: $CPU_MODEL, $CORES cores, $MEM_GIB GiB, Linux $KERNEL, RLIMIT_NOFILE hard limit $NOFILE, net.ipv4.tcp_max_tw_buckets $TW_NOW${TW_SET:+ (raised from $TW_SET for the run)}"
	echo "- software: fulcrum $FULCRUM_V, $GO_V, HAProxy $HAPROXY_V, nginx $NGINX_V, iperf3 $IPERF_V"
	echo "- run: $REPS repetition$([[ $REPS == 1 ]] || echo s) of ${DUR} s per workload after ${WARM} s warm-up; $IDLE idle connections asked; measuring took $((ELAPSED / 60))m$((ELAPSED % 60))s; CPUs $BUSY_BEFORE % busy in the $QUIET_S s before it; load average $LOAD_BEFORE before, $LOAD_AFTER after"
	[[ -n $shared ]] && echo "- $shared"
	[[ -n ${NOTE:-} ]] && echo "- note: $NOTE"
	echo
	cat "$WORK/table.md"
} >"$WORK/entry.md"

cat "$WORK/entry.md"
if [[ ${RECORD:-1} != 0 ]]; then
	{
		echo
		cat "$WORK/entry.md"
		echo
		echo "<details><summary>raw samples (repetition, target, key, value)</summary>"
		echo
		echo '```'
		cat "$SAMPLES"
		echo '```'
		echo "</details>"
	} >>"$ROOT/bench/RESULTS.md"
	say "appended to bench/RESULTS.md"
fi
