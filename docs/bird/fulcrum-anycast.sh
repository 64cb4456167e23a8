#!/bin/sh
# fulcrum-anycast.sh: announce the anycast route while fulcrum's /healthz
# answers 200, withdraw it while it does not (drained, stopping, no backend
# up, or fulcrum gone). It drives the fulcrum_vip protocol of
# docs/bird/bird.conf with birdc; run it next to bird, under systemd with
# Restart=always (docs/scale-out.md). Settings come from the environment:
#
#   HEALTHZ   fulcrum's /healthz ([admin] listen)   http://127.0.0.1:9900/healthz
#   PROTOCOL  the BIRD protocol to enable/disable   fulcrum_vip
#   BIRDC     the birdc command                     birdc
#   INTERVAL  seconds between checks                1
#   RISE      passes in a row before announcing     2
#   FALL      failures in a row before withdrawing  2
#   ROUNDS    checks before exiting, 0 = forever    0
set -u
HEALTHZ=${HEALTHZ:-http://127.0.0.1:9900/healthz}
PROTOCOL=${PROTOCOL:-fulcrum_vip}
BIRDC=${BIRDC:-birdc}
INTERVAL=${INTERVAL:-1}
RISE=${RISE:-2}
FALL=${FALL:-2}
ROUNDS=${ROUNDS:-0}

ok=0 bad=0 state=withdrawn round=0
while [ "$ROUNDS" -eq 0 ] || [ "$round" -lt "$ROUNDS" ]; do
	round=$((round + 1))
	if curl --silent --fail --max-time 1 --output /dev/null "$HEALTHZ"; then
		ok=$((ok + 1)) bad=0
	else
		bad=$((bad + 1)) ok=0
	fi
	if [ "$state" = withdrawn ] && [ "$ok" -ge "$RISE" ]; then
		$BIRDC enable "$PROTOCOL" >/dev/null && state=announced && echo "announced: $HEALTHZ passed $ok times"
	elif [ "$state" = announced ] && [ "$bad" -ge "$FALL" ]; then
		$BIRDC disable "$PROTOCOL" >/dev/null && state=withdrawn && echo "withdrawn: $HEALTHZ failed $bad times"
	fi
	sleep "$INTERVAL"
done
