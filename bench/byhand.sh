#!/usr/bin/env bash
# byhand.sh: one fulcrum build (or several, taking turns) under one synthetic
# load, with perf stat counting what its process does per operation. It runs
# the measurements bench/README.md quotes as "by hand". run.sh gives rates
# and medians over many workloads and targets. This script goes deeper on
# one row: CPU, system calls, epoll waits and context switches per
# operation, from the kernel's counters, and a call-graph profile if asked.
#
#   bench/byhand.sh [BINARY ...]        (default: this tree, built)
#
# Each BINARY is a fulcrum executable, or "nginx" (one worker, as run.sh
# configures it) or "nginx-half-close" (the same with proxy_half_close and
# proxy_socket_keepalive on, the half-close and backend keepalive fulcrum
# keeps), counted on its worker. With several, they take turns PAIRS times
# (A B A B …), each on the same ports in turn, so that every run of one has
# a run of the other beside it (read them as pairs: this VM drifts).
#
# Knobs, all optional:
#   MODE=pingpong   tcpload's mode: pingpong (C persistent connections, 64 B
#                   round trips) or connrate (C clients connecting, 64 B echo,
#                   closing)
#   C=1             connections (pingpong) or clients (connrate)
#   DUR=4           seconds measured per run, after WARM=1 s unmeasured
#   PAIRS=3         turns per binary
#   PROXY_CPU=1     the CPU fulcrum runs on, alone, with GOMAXPROCS=1
#   LOAD_CPU=0      the CPU of the client and the three echo backends
#   PROFILE=0       1: after the turns, perf record -g of the first binary
#                   for DUR s and the top of its report (needs perf)
#   PORT_BASE=23000 ports PORT_BASE+1 … +3 (echo) and +100 (fulcrum); below 32768
#
# Output: one line per run, with the figures per operation.
set -euo pipefail
export LC_ALL=C

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MODE=${MODE:-pingpong} C=${C:-1} DUR=${DUR:-4} WARM=${WARM:-1} PAIRS=${PAIRS:-3}
PROXY_CPU=${PROXY_CPU:-1} LOAD_CPU=${LOAD_CPU:-0} PROFILE=${PROFILE:-0} PORT_BASE=${PORT_BASE:-23000}
case $MODE in pingpong | connrate) ;; *) echo "byhand: MODE must be pingpong or connrate, got $MODE" >&2; exit 2 ;; esac
command -v perf >/dev/null || { echo "byhand: needs perf (Debian: linux-perf)" >&2; exit 2; }
command -v jq >/dev/null || { echo "byhand: needs jq" >&2; exit 2; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/fulcrum-byhand.XXXXXX")
PIDS=()
cleanup() {
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$WORK"
}
trap cleanup EXIT

(cd "$ROOT" && go build -o "$WORK/tcpload" ./bench/tcpload)
BINS=("$@")
if ((${#BINS[@]} == 0)); then
	(cd "$ROOT" && go build -o "$WORK/fulcrum" .)
	BINS=("$WORK/fulcrum")
fi
for b in "${BINS[@]}"; do
	case $b in
	nginx | nginx-half-close) command -v nginx >/dev/null || { echo "byhand: $b needs nginx and its stream module" >&2; exit 2; } ;;
	*) [[ -x $b ]] || { echo "byhand: $b is not an executable" >&2; exit 2; } ;;
	esac
done

E1=$((PORT_BASE + 1)) E2=$((PORT_BASE + 2)) E3=$((PORT_BASE + 3)) FRONT=$((PORT_BASE + 100))
cat >"$WORK/fulcrum.toml" <<EOF
[log]
level  = "warn"
format = "json"
access = false

[defaults]
scheduler       = "rr"
connect_timeout = "5s"

[services.echo]
listen   = ["127.0.0.1:$FRONT"]
backends = [
  { name = "echo1", address = "127.0.0.1:$E1" },
  { name = "echo2", address = "127.0.0.1:$E2" },
  { name = "echo3", address = "127.0.0.1:$E3" },
]
EOF

# nginx_conf EXTRA: one worker, the three echo backends at FRONT, EXTRA in
# the server block; its stream module loaded if Debian ships it apart.
nginx_conf() {
	local mods
	mods=$(nginx -V 2>&1 | tr ' ' '\n' | sed -n 's/^--modules-path=//p')
	[[ -e $mods/ngx_stream_module.so ]] && echo "load_module $mods/ngx_stream_module.so;"
	cat <<EOF
daemon off;
master_process on;
worker_processes 1;
worker_rlimit_nofile 20000;
pid $WORK/nginx.pid;
error_log stderr warn;
events { worker_connections 19000; }
stream {
    upstream echo {
        server 127.0.0.1:$E1;
        server 127.0.0.1:$E2;
        server 127.0.0.1:$E3;
    }
    proxy_connect_timeout 5s;
    server {
        listen 127.0.0.1:$FRONT reuseport;
        proxy_pass echo;
        $1
    }
}
EOF
}
nginx_conf "" >"$WORK/nginx.conf"
nginx_conf "proxy_half_close on; proxy_socket_keepalive on;" >"$WORK/nginx-half-close.conf"

# listening PORT: whether something listens on PORT.
listening() { [[ -n $(ss -Hltn "sport = :$1") ]]; }
wait_listen() {
	for _ in $(seq 100); do listening "$1" && return 0; sleep 0.05; done
	echo "byhand: nothing listens on $1 after 5 s" >&2
	exit 1
}

for p in $E1 $E2 $E3; do
	taskset -c "$LOAD_CPU" "$WORK/tcpload" -mode echo -listen "127.0.0.1:$p" -life 1h >"$WORK/echo-$p.log" 2>&1 &
	PIDS+=($!)
	wait_listen "$p"
done

EVENTS=task-clock,context-switches,raw_syscalls:sys_enter,syscalls:sys_enter_epoll_pwait,syscalls:sys_enter_epoll_wait

# run BINARY: start it on PROXY_CPU, load it, count its process for DUR s.
run() {
	local bin=$1 pid load stat span=$((DUR + 1))
	[[ $PROFILE == 1 && -z ${PROFILED:-} ]] && span=$((2 * DUR + 1)) # the profile's DUR s under load too
	local main
	case $bin in
	nginx | nginx-half-close) taskset -c "$PROXY_CPU" nginx -c "$WORK/$bin.conf" >"$WORK/nginx.log" 2>&1 & ;;
	*) GOMAXPROCS=1 taskset -c "$PROXY_CPU" "$bin" -config "$WORK/fulcrum.toml" >"$WORK/fulcrum.log" 2>&1 & ;;
	esac
	main=$!
	PIDS+=("$main") # cleanup stops it if the script fails before the run does
	wait_listen "$FRONT"
	pid=$main
	if [[ $bin == nginx* ]]; then # the worker: what proxies
		for _ in $(seq 100); do pid=$(pgrep -P "$main") && break; sleep 0.05; done
		[[ $pid != "$main" ]] || { echo "byhand: nginx started no worker in 5 s" >&2; exit 1; }
	fi
	load=$WORK/load.json stat=$WORK/stat.csv
	# The client's warm-up runs first; perf starts after it and stops before the client does.
	taskset -c "$LOAD_CPU" "$WORK/tcpload" -mode "$MODE" -addr "127.0.0.1:$FRONT" -c "$C" \
		-warmup "${WARM}s" -d "${span}s" >"$load" &
	local client=$!
	PIDS+=("$client")
	sleep "$WARM"
	perf stat -x, -o "$stat" -e "$EVENTS" -p "$pid" -- sleep "$DUR"
	if [[ $PROFILE == 1 && -z ${PROFILED:-} ]]; then
		PROFILED=1
		perf record -q -g -o "$WORK/perf.data" -p "$pid" -- sleep "$DUR" 2>/dev/null || true
	fi
	wait "$client"
	kill "$main"
	wait "$main" 2>/dev/null || true
	for _ in $(seq 100); do listening "$FRONT" || break; sleep 0.05; done # the next run binds the same port
	if listening "$FRONT"; then echo "byhand: $FRONT still listened on 5 s after $(basename "$bin") was stopped" >&2; exit 1; fi
	awk -F, -v bin="$(basename "$bin")" -v rate="$(jq -r .ops_per_s "$load")" -v dur="$DUR" \
		-v lat="$(jq -r '"p50 \(.p50_us) p99 \(.p99_us) p99.9 \(.p999_us) µs"' "$load")" '
		$3 == "task-clock" { cpu = $1 * 1000 }  # µs
		$3 == "context-switches" { cs = $1 }
		$3 == "raw_syscalls:sys_enter" { sys = $1 }
		$3 ~ /epoll_p?wait$/ { waits += $1 }
		END {
			ops = rate * dur # the client runs steadily around the window perf counts: its rate times the window
			if (ops <= 0) { printf "%-16s no operations\n", bin; exit }
			printf "%-16s %9.0f ops/s  %7.1f µs CPU  %6.2f syscalls  %5.2f epoll waits  %5.2f context switches per op; %s\n",
				bin, rate, cpu / ops, sys / ops, waits / ops, cs / ops, lat
		}' "$stat"
}

echo "# $MODE, c=$C, ${DUR} s per run; the proxy on CPU $PROXY_CPU (fulcrum with GOMAXPROCS=1, nginx with one worker), client and echo on CPU $LOAD_CPU; $(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)"
for ((i = 1; i <= PAIRS; i++)); do
	for b in "${BINS[@]}"; do run "$b"; done
done
if [[ $PROFILE == 1 && -s $WORK/perf.data ]]; then
	echo "# perf record -g of $(basename "${BINS[0]}"), top of the report (--no-children):"
	perf report -q -i "$WORK/perf.data" --stdio --no-children --percent-limit 2 2>/dev/null | grep -v '^$' | head -40
fi
