#!/usr/bin/env bash
# bench/run.sh: fulcrum side by side with a direct connection, HAProxy, nginx
# and a naive Go io.Copy proxy, all on 127.0.0.1 (issue 7). It prints one
# Markdown table of medians and ratios and appends it to bench/RESULTS.md.
#
#   bench/run.sh              full run: 3 repetitions, 5 s per workload, 9,000 idle connections (~15 min)
#   QUICK=1 bench/run.sh      the same in under 3 minutes: 1 s per workload, 4,000 idle connections
#
# Environment (all optional):
#   REPS=3  DUR=5 (whole seconds)  WARM=1 (seconds, may be fractional)  IDLE=9000
#   TARGETS="direct haproxy nginx naive fulcrum"
#     (also "other": another fulcrum binary, OTHER=path, labelled OTHER_LABEL, for an A/B run)
#   WORKLOADS="bulk1 bulk4 conn pp1 pp32 open50 open80 idle pg rget rpipe rnew scale"
#     open50, open80: 64 B messages on 32 connections offered at a fixed rate (open loop, latency from
#     each message's due time), 50% and 80% of the best of HAProxy's and nginx's pp32 rate in the same
#     repetition (so they come after pp32)
#     pg: pgbench -S, 16 persistent clients, against a PostgreSQL 15 it initdb's and starts itself;
#     rget: redis-benchmark -t get -c 50; rpipe: the same with -P 32 -d 1024; rnew: with -k 0
#     (a new connection per request), against a redis-server it starts itself
#     scale: fulcrum only (fulcrum, other): the connection-rate run again in a fulcrum of its own with
#     3, 1,000 and 10,000 backends, and with 3 while SCALE_IDLE idle connections are held (the cost as
#     the work grows; a table of its own)
#   SCALE_IDLE=8900 (QUICK 4000): idle connections held during one of the scale runs
#   PORT_BASE=21000 (uses PORT_BASE+1 … PORT_BASE+505; all below 32768)   RECORD=0 (do not append to RESULTS.md)
#   KEEP=1 (keep the work directory with configs, logs and raw outputs)   NOTE="…" (a line for RESULTS.md)
#
# Everything it starts runs in its own process group and is stopped on exit,
# Ctrl-C or failure. Missing HAProxy, nginx (with its stream module), iperf3
# or jq are installed with apt-get (as root).
set -euo pipefail
export LC_ALL=C

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

# The command as given, for RESULTS.md: the knobs set in the environment, then the script.
CMDLINE=""
for v in QUICK REPS DUR WARM IDLE SCALE_IDLE TARGETS WORKLOADS PORT_BASE OTHER_LABEL; do
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
read -r -a WORKLOADS <<<"${WORKLOADS:-bulk1 bulk4 conn pp1 pp32 open50 open80 idle pg rget rpipe rnew scale}"
PORT_BASE=${PORT_BASE:-21000}
[[ $DUR =~ ^[1-9][0-9]*$ ]] || { echo "bench: DUR must be whole seconds (iperf3 -t), got $DUR" >&2; exit 2; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/fulcrum-bench.XXXXXX")
BIN=$WORK/bin RAW=$WORK/raw LOG=$WORK/log
mkdir -p "$BIN" "$RAW" "$LOG" "$WORK/pid" "$WORK/nginx"
SAMPLES=$WORK/samples.tsv
: >"$SAMPLES"
declare -A PID=() # name → pid of a process we started; each leads its own process group
CLIENT=""         # the load client running in the foreground, if any
REP=0

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

# wait_listen NAME PORT…: poll until NAME listens on every port (15 s at most).
wait_listen() {
	local name=$1 p deadline=$((SECONDS + 15))
	shift
	for p in "$@"; do
		until listening "$p"; do
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
	timeout -k 2 "$limit" "$@" >"$out" 2>>"$LOG/clients.err" &
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

install_missing() {
	local pkgs=()
	have haproxy || pkgs+=(haproxy)
	have nginx || pkgs+=(nginx libnginx-mod-stream)
	if have nginx && [[ $(nginx_stream) == dynamic && ! -e $(nginx_modules)/ngx_stream_module.so ]]; then
		pkgs+=(libnginx-mod-stream) # Debian ships the stream module as its own package
	fi
	have iperf3 || pkgs+=(iperf3)
	have jq || pkgs+=(jq)
	if wants pg; then
		have pgbench || pkgs+=(postgresql-client-15)
		[[ -x $PG_BIN/initdb ]] || pkgs+=(postgresql-15)
	fi
	if wants rget || wants rpipe || wants rnew; then
		have redis-server || pkgs+=(redis-server)
		have redis-benchmark || pkgs+=(redis-tools)
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

say "building fulcrum and the load tools"
REV=$(git describe --always --dirty 2>/dev/null || echo unknown) # GOFLAGS may hold -buildvcs=false
go build -ldflags "-X main.version=$REV" -o "$BIN/" . ./bench/tcpload ./bench/naive ./bench/report || fail "go build failed"

CPU_MODEL=$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)
CORES=$(nproc)
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
declare -A FRONT=() IFRONT=() PGFRONT=() RFRONT=() SFRONT=() # a proxy's ports for the echo backends, iperf3, PostgreSQL, Redis, scale
for t in haproxy nginx naive fulcrum other; do
	case $t in haproxy) p=$((PORT_BASE + 101)) ;; nginx) p=$((PORT_BASE + 201)) ;; naive) p=$((PORT_BASE + 301)) ;; fulcrum) p=$((PORT_BASE + 401)) ;; other) p=$((PORT_BASE + 501)) ;; esac
	FRONT[$t]=$p
	IFRONT[$t]=$((p + 1))
	PGFRONT[$t]=$((p + 2))
	RFRONT[$t]=$((p + 3))
	SFRONT[$t]=$((p + 4)) # scale: fulcrum's own process with many backends
done
ECHO_ADDRS="127.0.0.1:${P_ECHO[0]},127.0.0.1:${P_ECHO[1]},127.0.0.1:${P_ECHO[2]}"

echo_addr() { if [[ $1 == direct ]]; then echo "$ECHO_ADDRS"; else echo "127.0.0.1:${FRONT[$1]}"; fi; }
iperf_port() { if [[ $1 == direct ]]; then echo "$P_IPERF"; else echo "${IFRONT[$1]}"; fi; }
pg_port() { if [[ $1 == direct ]]; then echo "$P_PG"; else echo "${PGFRONT[$1]}"; fi; }
redis_port() { if [[ $1 == direct ]]; then echo "$P_REDIS"; else echo "${RFRONT[$1]}"; fi; }

for t in "${TARGETS[@]}"; do
	[[ $t == direct || -n ${FRONT[$t]:-} ]] || fail "unknown target $t (direct haproxy nginx naive fulcrum other)"
	[[ $t != other || -x ${OTHER:-} ]] || fail "target other needs OTHER=path to a fulcrum binary"
done
for p in "${P_ECHO[@]}" "$P_IPERF" "$P_PG" "$P_REDIS" "${FRONT[@]}" "${IFRONT[@]}" "${PGFRONT[@]}" "${RFRONT[@]}" "${SFRONT[@]}"; do
	listening "$p" && fail "port $p is already in use; choose other ports with PORT_BASE"
done

# HAProxy: two threads, kernel splicing when it pays, connection limits that
# fit the descriptor limit: 2 per connection plus 2 per pipe must stay under
# $NOFILE (9,900 × 2 + 64 × 2 + listeners = 19,938 < 20,000).
cat >"$WORK/haproxy.cfg" <<EOF
global
    nbthread 2
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
EOF

# nginx: the stream module, two workers, one listening socket per worker
# (reuseport); a worker counts client and upstream connections against
# worker_connections, and each worker has its own $NOFILE descriptors.
{
	[[ $(nginx_stream) == dynamic ]] && echo "load_module $(nginx_modules)/ngx_stream_module.so;"
	cat <<EOF
daemon off;
master_process on;
worker_processes 2;
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
}
EOF
} >"$WORK/nginx.conf"

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
EOF
}
fulcrum_toml fulcrum >"$WORK/fulcrum.toml"
# other: the same for another fulcrum binary, on its own ports.
fulcrum_toml other >"$WORK/other.toml"

haproxy -c -f "$WORK/haproxy.cfg" >"$LOG/haproxy-check.log" 2>&1 || fail "haproxy -c: $(tail -n 5 "$LOG/haproxy-check.log")"
nginx -t -c "$WORK/nginx.conf" -p "$WORK/nginx/" -e stderr >"$LOG/nginx-check.log" 2>&1 || fail "nginx -t: $(tail -n 5 "$LOG/nginx-check.log")"
for f in fulcrum other; do
	"$BIN/fulcrum" -check -config "$WORK/$f.toml" >"$LOG/$f-check.log" 2>&1 || fail "fulcrum -check $f.toml: $(cat "$LOG/$f-check.log")"
done

start_proxy() {
	local t=$1 e=127.0.0.1:${P_ECHO[0]},127.0.0.1:${P_ECHO[1]},127.0.0.1:${P_ECHO[2]}
	case $t in
	haproxy) start haproxy haproxy -db -f "$WORK/haproxy.cfg" ;;
	nginx) start nginx nginx -c "$WORK/nginx.conf" -p "$WORK/nginx/" -e stderr ;;
	naive) start naive "$BIN/naive" "127.0.0.1:${FRONT[naive]}=$e" "127.0.0.1:${IFRONT[naive]}=127.0.0.1:$P_IPERF" \
		"127.0.0.1:${PGFRONT[naive]}=127.0.0.1:$P_PG" "127.0.0.1:${RFRONT[naive]}=127.0.0.1:$P_REDIS" ;;
	fulcrum) start fulcrum "$BIN/fulcrum" -config "$WORK/fulcrum.toml" ;;
	other) start other "$OTHER" -config "$WORK/other.toml" ;;
	esac
	wait_listen "$t" "${FRONT[$t]}" "${IFRONT[$t]}" "${PGFRONT[$t]}" "${RFRONT[$t]}"
}

# smoke TARGET: one connection must echo before anything is measured.
smoke() {
	local out=$RAW/smoke-$1.json
	client "$out" 20 "$BIN/tcpload" -mode pingpong -addr "$(echo_addr "$1")" -c 3 -d 200ms -warmup 0s ||
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
		-c unix_socket_directories="$WORK/pg" -c fsync=off -c synchronous_commit=off -c max_connections=100 \
		-c shared_buffers=128MB
	wait_listen pg "$P_PG"
	local i
	for ((i = 0; i < 100; i++)); do
		pgbench -i -q -s 1 -h 127.0.0.1 -p "$P_PG" -U postgres postgres >"$LOG/pgbench-init.log" 2>&1 && return 0
		sleep 0.1 # listening before it accepts logins
	done
	fail "pgbench -i: $(tail -n 5 "$LOG/pgbench-init.log")"
}

say "starting 3 echo backends, an iperf3 server and ${TARGETS[*]}"
for i in 0 1 2; do start "echo$((i + 1))" "$BIN/tcpload" -mode echo -listen "127.0.0.1:${P_ECHO[i]}"; done
start iperf3 iperf3 -s -B 127.0.0.1 -p "$P_IPERF"
for i in 0 1 2; do wait_listen "echo$((i + 1))" "${P_ECHO[i]}"; done
wait_listen iperf3 "$P_IPERF"
wants pg && start_pg
if wants rget || wants rpipe || wants rnew; then
	start redis redis-server --port "$P_REDIS" --bind 127.0.0.1 --save '' --appendonly no --protected-mode no
	wait_listen redis "$P_REDIS"
fi
for t in "${TARGETS[@]}"; do
	[[ $t == direct ]] || start_proxy "$t"
	smoke "$t"
done

# ---------------------------------------------------------------- workloads

sample() { printf '%s\t%s\t%s\t%s\n' "$REP" "$1" "$2" "$3" >>"$SAMPLES"; }

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

# bulk TARGET STREAMS KEY: iperf3 through TARGET; proxy CPU over the run.
bulk() {
	local t=$1 n=$2 k=$3 out=$RAW/$REP-$1-$3.json c0 c1
	for _ in 1 2; do
		c0=$(cpu_ticks_of "$t")
		if client "$out" $((DUR + 30)) iperf3 -c 127.0.0.1 -p "$(iperf_port "$t")" -t "$DUR" -P "$n" -J --connect-timeout 5000; then
			c1=$(cpu_ticks_of "$t")
			jq -r '.end.sum_received | "\(.bits_per_second) \(.bytes)"' "$out" | {
				read -r bps bytes
				sample "$t" "${k}_bps" "$bps"
				sample "$t" "${k}_bytes" "$bytes"
			}
			[[ $t == direct ]] || sample "$t" "${k}_cpu_ticks" $((c1 - c0))
			return 0
		fi
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
	local t=$1 out=$RAW/$REP-$1-conn.json c0 c1
	c0=$(cpu_ticks_of "$t")
	if client "$out" $((DUR + 40)) "$BIN/tcpload" -mode connrate -addr "$(echo_addr "$t")" -c 32 -size 64 -d "${DUR}s" -warmup "${WARM}s"; then
		c1=$(cpu_ticks_of "$t")
		record "$t" conn "$out" conn_rate=ops_per_s conn_total=ops_total
		[[ $t == direct ]] || sample "$t" conn_cpu_ticks $((c1 - c0))
	else
		warn "$t conn: tcpload failed"
		sample "$t" conn_failed 1
	fi
}

# pp TARGET CONNS KEY: 64 B request/response on CONNS persistent connections.
pp() {
	local t=$1 c=$2 k=$3 out=$RAW/$REP-$1-$3.json
	if client "$out" $((DUR + 40)) "$BIN/tcpload" -mode pingpong -addr "$(echo_addr "$t")" -c "$c" -size 64 -d "${DUR}s" -warmup "${WARM}s"; then
		record "$t" "$k" "$out" "${k}_rate=ops_per_s" "${k}_p50_us=p50_us" "${k}_p99_us=p99_us" "${k}_p999_us=p999_us"
	else
		warn "$t $k: tcpload failed"
		sample "$t" "${k}_failed" 1
	fi
}

# peak: the best closed-loop pp32 rate of HAProxy and nginx in this
# repetition (of any proxy if neither ran), or nothing.
peak() {
	awk -F'\t' -v rep="$REP" '$1 == rep && $3 == "pp32_rate" && $2 != "direct" {
		if ($2 == "haproxy" || $2 == "nginx") { if ($4 > peer) peer = $4 } else if ($4 > any) any = $4 }
		END { r = peer ? peer : any; if (r) printf "%d\n", r }' "$SAMPLES"
}

# open TARGET PERCENT KEY: the open loop at PERCENT of peak.
open() {
	local t=$1 pct=$2 k=$3 out=$RAW/$REP-$1-$3.json rate
	rate=$(peak)
	if [[ -z $rate ]]; then
		warn "$t $k: no pp32 rate in this repetition to take $pct% of (run pp32 first)"
		sample "$t" "${k}_failed" 1
		return 0
	fi
	rate=$((rate * pct / 100))
	if client "$out" $((DUR + 40)) "$BIN/tcpload" -mode openloop -addr "$(echo_addr "$t")" -c 32 -rate "$rate" -size 64 -d "${DUR}s" -warmup "${WARM}s"; then
		record "$t" "$k" "$out" "${k}_rate=ops_per_s" "${k}_offered=offered_per_s" "${k}_p50_us=p50_us" "${k}_p99_us=p99_us" "${k}_p999_us=p999_us"
	else
		warn "$t $k: tcpload failed"
		sample "$t" "${k}_failed" 1
	fi
}

# pg TARGET: pgbench -S (select only) on 16 persistent connections; proxy
# CPU over the run.
pg() {
	local t=$1 out=$RAW/$REP-$1-pg.txt c0 c1 tps n
	c0=$(cpu_ticks_of "$t")
	if client "$out" $((DUR + 30)) pgbench -S -n -c 16 -j 2 -T "$DUR" -h 127.0.0.1 -p "$(pg_port "$t")" -U postgres postgres; then
		c1=$(cpu_ticks_of "$t")
		tps=$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' "$out" | tail -n 1)
		n=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$out")
		if [[ -n $tps && -n $n ]]; then
			sample "$t" pg_tps "$tps"
			sample "$t" pg_ops "$n"
			[[ $t == direct ]] || sample "$t" pg_cpu_ticks $((c1 - c0))
			return 0
		fi
	fi
	warn "$t pg: pgbench failed: $(tail -n 2 "$out" "$LOG/clients.err" 2>/dev/null | head -c 300)"
	sample "$t" pg_failed 1
}

# redis TARGET KEY VALUE_BYTES REQUESTS ARGS…: redis-benchmark -t get with
# ARGS, after setting the key it reads to VALUE_BYTES bytes; proxy CPU over
# the run. REQUESTS is per second of DUR (redis-benchmark runs a count, not
# a duration).
redis() {
	local t=$1 k=$2 size=$3 n=$(($4 * DUR)) out=$RAW/$REP-$1-$2.csv c0 c1 rps
	shift 4
	redis-cli -h 127.0.0.1 -p "$P_REDIS" set key:__rand_int__ "$(head -c "$size" /dev/zero | tr '\0' x)" >/dev/null ||
		fail "redis-cli set failed"
	c0=$(cpu_ticks_of "$t")
	if client "$out" $((DUR * 5 + 30)) redis-benchmark -h 127.0.0.1 -p "$(redis_port "$t")" -t get -n "$n" --csv "$@"; then
		c1=$(cpu_ticks_of "$t")
		rps=$(awk -F'"' '$2 == "GET" {print $4}' "$out")
		if [[ -n $rps ]]; then
			sample "$t" "${k}_rps" "$rps"
			sample "$t" "${k}_ops" "$n"
			[[ $t == direct ]] || sample "$t" "${k}_cpu_ticks" $((c1 - c0))
			return 0
		fi
	fi
	warn "$t $k: redis-benchmark failed: $(tail -n 2 "$out" 2>/dev/null | head -c 300)"
	sample "$t" "${k}_failed" 1
}

# idle TARGET: a fresh proxy, then $IDLE connections opened, pinged and held;
# RSS and descriptors before and $SETTLE s after all are up; a final ping of
# each. The proxy is restarted again afterwards so that the next workload
# does not run among the remains of thousands of connections.
idle() {
	local t=$1 name=idle-$REP-$1 ready=$WORK/idle.ready r0 f0 r1 f1 deadline out rc=0
	[[ $t == direct ]] && return 0
	stop "$t"
	start_proxy "$t"
	r0=$(rss_kib "$t") f0=$(fds "$t")
	rm -f "$ready"
	start "$name" "$BIN/tcpload" -mode idle -addr "$(echo_addr "$t")" -c "$IDLE" -size 64 -par 512 -timeout 1s \
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
		cp "$out" "$RAW/$REP-$t-idle.json"
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
	local out=$RAW/$REP-$1-$4.json ready=$WORK/scale-idle.ready c0 c1 deadline rc=0
	scale_toml "$port" "$n" >"$WORK/scale-$t-$n.toml"
	start "$name" "$bin" -config "$WORK/scale-$t-$n.toml"
	wait_listen "$name" "$port"
	if ((idle > 0)); then
		rm -f "$ready"
		start "$holder" "$BIN/tcpload" -mode idle -addr "127.0.0.2:$port" -c "$idle" -size 64 -par 512 -timeout 1s \
			-open-budget "${OPEN_BUDGET}s" -hold 10m -ready "$ready"
		deadline=$((SECONDS + OPEN_BUDGET + 30))
		until [[ -e $ready ]] || ! alive "$holder" || ((SECONDS >= deadline)); do sleep 0.1; done
		[[ -e $ready ]] || warn "$t $k: the idle connections did not open: $(tail -n 3 "$LOG/$holder.err")"
	fi
	c0=$(cpu_ticks "$name")
	if client "$out" $((DUR + 40)) "$BIN/tcpload" -mode connrate -addr "127.0.0.1:$port" -c 32 -size 64 -d "${DUR}s" -warmup "${WARM}s"; then
		c1=$(cpu_ticks "$name")
		record "$t" "$k" "$out" "${k}_rate=ops_per_s" "${k}_total=ops_total" "${k}_p50_us=p50_us" "${k}_p99_us=p99_us"
		sample "$t" "${k}_cpu_ticks" $((c1 - c0))
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
			tail -n 1 "$LOG/$holder.out" >"$RAW/$REP-$t-$k-held.json"
			record "$t" "$k" "$RAW/$REP-$t-$k-held.json" "${k}_held=alive"
		fi
	fi
	stop "$holder"
	stop "$name"
}

say "measuring: ${REPS} repetitions of ${WORKLOADS[*]} (${DUR} s each after ${WARM} s warm-up; ${IDLE} idle connections)"
START=$SECONDS
for ((REP = 1; REP <= REPS; REP++)); do
	# Round robin over the targets within each workload, starting one further
	# along each repetition, so that no target always runs first or last.
	order=("${TARGETS[@]:REP % ${#TARGETS[@]}}" "${TARGETS[@]:0:REP % ${#TARGETS[@]}}")
	for w in "${WORKLOADS[@]}"; do
		say "repetition $REP/$REPS: $w"
		for t in "${order[@]}"; do
			case $w in
			bulk1) bulk "$t" 1 bulk1 ;;
			bulk4) bulk "$t" 4 bulk4 ;;
			conn) conn "$t" ;;
			pp1) pp "$t" 1 pp1 ;;
			pp32) pp "$t" 32 pp32 ;;
			open50) open "$t" 50 open50 ;;
			open80) open "$t" 80 open80 ;;
			idle) idle "$t" ;;
			pg) pg "$t" ;;
			rget) redis "$t" rget 3 30000 -c 50 ;;
			rpipe) redis "$t" rpipe 1024 400000 -c 50 -P 32 ;;
			rnew) redis "$t" rnew 3 5000 -c 50 -k 0 ;;
			scale) scale "$t" ;;
			*) fail "unknown workload $w (bulk1 bulk4 conn pp1 pp32 open50 open80 idle pg rget rpipe rnew scale)" ;;
			esac
		done
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
if awk -v l="$LOAD_BEFORE" 'BEGIN { exit !(l > 0.5) }'; then
	shared="Taken on a shared machine: other work was running (load average $LOAD_BEFORE before the run), so figures are noisy."
fi
{
	echo "## $(date -u '+%Y-%m-%d %H:%M UTC') · \`$CMDLINE\`"
	echo
	echo "- machine: $CPU_MODEL, $CORES cores, $MEM_GIB GiB, Linux $KERNEL, RLIMIT_NOFILE hard limit $NOFILE, net.ipv4.tcp_max_tw_buckets $TW_NOW${TW_SET:+ (raised from $TW_SET for the run)}"
	echo "- software: fulcrum $FULCRUM_V, $GO_V, HAProxy $HAPROXY_V, nginx $NGINX_V, iperf3 $IPERF_V"
	echo "- run: $REPS repetition$([[ $REPS == 1 ]] || echo s) of ${DUR} s per workload after ${WARM} s warm-up; $IDLE idle connections asked; measuring took $((ELAPSED / 60))m$((ELAPSED % 60))s; load average $LOAD_BEFORE before, $LOAD_AFTER after"
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
