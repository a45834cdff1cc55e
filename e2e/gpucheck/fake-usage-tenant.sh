#!/bin/sh
# The usage check's fake-GPU workload, in place of usage.py: fgpu-probe replays usage.py's
# pattern (as its e2e pods do) into the fake GPU's usage file, under its node PID, within the
# claim's MPS memory cap. Usage: fake-usage-tenant.sh NAME SECONDS
name=$1 secs=$2
case $name in
  steady) steps="0:6Gi:10" ;;
  # 2 GiB, one more every 15 s of the 3-minute pattern up to 10 GiB at 120 s, held to the end.
  ramp) steps="0:2Gi:60,15:3Gi:70,30:4Gi:75,45:5Gi:80,60:6Gi:85,75:7Gi:90,90:8Gi:90,105:9Gi:95,120:10Gi:95" ;;
  *) echo "unknown pattern $name"; exit 1 ;;
esac
speed=$(awk "BEGIN { print 180 / $secs }")
timeout "$secs" fgpu-probe --replay-usage "$steps" --usage-dir /fake-dev --speed "$speed" > /dev/null
rc=$?
[ $rc = 124 ] && rc=0 # played to the end
echo "[$name] replayed $steps at speed $speed: exit $rc"
exit $rc
