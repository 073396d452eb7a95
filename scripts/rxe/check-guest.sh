#!/bin/sh
# check-guest.sh QPDRAIN [--probe NAME] [CHECK-FLAGS...]: runs inside the guest of `qpdrain vm run`
# (check-record.sh passes it with --files): `QPDRAIN check --device DEVICE -j CHECK-FLAGS` between the
# markers internal/providers' record reads (BeginMark, " device=DEVICE", then " probe=NAME" with
# --probe, which runs that probe alone: --run '^NAME$'; EndMark with " exit=STATUS"), its stderr
# after them. DEVICE is the provider's, QPDRAIN_TEST_DEVICE (qpdrain vm run sets it: rxe0, siw0).
#
# A verbs call stuck in the kernel ends the check with that probe hung (--call-timeout), but the
# process may then never exit: its exit cannot release a QP whose thread spins or sleeps in the
# provider (seen on 5.10's rxe). So the check runs in the background, and once its JSON is complete
# and the process has not exited for RXE_CHECK_EXIT_WAIT seconds (10), the record ends with
# exit=stuck, followed by where its threads are in the kernel and the kernel log's tail, the lines
# record takes the kernel's first complaint from.
q=${1:?usage: check-guest.sh QPDRAIN [--probe NAME] [CHECK-FLAGS...]}
shift
probe=
if [ "${1:-}" = --probe ]; then
	probe=$2
	shift 2
	set -- --run "^$probe\$" "$@"
fi
dev=${QPDRAIN_TEST_DEVICE:-rxe0}
echo "@@qpdrain-check-json begin device=$dev${probe:+ probe=$probe}"
"$q" check --device "$dev" -j "$@" >/tmp/check.json 2>/tmp/check.err &
pid=$!
waited=0
rc=stuck
while :; do
	if ! kill -0 "$pid" 2>/dev/null; then
		wait "$pid"
		rc=$?
		break
	fi
	if [ "$(tail -n 1 /tmp/check.json 2>/dev/null)" = "}" ]; then
		waited=$((waited + 1))
		[ "$waited" -gt "${RXE_CHECK_EXIT_WAIT:-10}" ] && break
	fi
	sleep 1
done
cat /tmp/check.json
echo "@@qpdrain-check-json end exit=$rc"
cat /tmp/check.err >&2
if [ "$rc" = stuck ]; then
	echo "qpdrain check (pid $pid) wrote its record but did not exit within ${RXE_CHECK_EXIT_WAIT:-10}s:"
	for t in /proc/"$pid"/task/*; do
		echo "thread ${t##*/}: $(grep '^State' "$t/status" 2>/dev/null)"
		sed 's/^/  /' "$t/stack" 2>/dev/null
	done
	# The kernel's first complaint (a stall report can be longer than the tail), then the tail.
	echo "kernel log, first complaint: $(dmesg | grep -m 1 -E 'BUG:|Oops|soft lockup|self-detected stall|rcu: INFO|blocked for more than')"
	echo "kernel log:"
	dmesg | tail -n 40
	exit 0
fi
# 0: every probe passed; 1: deviations; 4: a verbs call hung (the record is complete).
[ "$rc" -le 1 ] || [ "$rc" = 4 ]
