set -x
REAL_OUT=$OUT; export OUT=/tmp/d; mkdir -p $OUT
export PYTHONUNBUFFERED=1 DPSCALE_GIT_COMMIT=diag
rm -f /tmp/bin/python; mkdir -p /tmp/bin; command -v python >/dev/null || ln -sf "$(command -v python3)" /tmp/bin/python; export PATH=/tmp/bin:$PATH
source tools/gpu/site.sh
nproc; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
P='scales={paper: {launches: 2}}'
bash tools/gpu/profile_launch.sh tuned results/runs/ddp_weak/tuned/k1.json "$P"
bash tools/gpu/profile_launch.sh seed results/runs/ddp_weak/seed/k1.json "$P"
rm -f results/runs/ddp_weak/tuned/*k1*
TORCHINDUCTOR_COMPILE_THREADS=1 bash tools/gpu/profile_launch.sh tuned1thr results/runs/ddp_weak/tuned/k1.json "$P"
bash tools/gpu/profile_launch.sh tta results/runs/ddp_tta/book/k1.json
for fast in; do
  python3 - "$fast" <<'PY'
import subprocess, sys, time, re, os
env = dict(os.environ, FAST_EXIT=sys.argv[1])
t0 = time.time()
p = subprocess.run(["torchrun", "--standalone", "--nproc-per-node=1", ".diag/exitprobe.py"], capture_output=True, text=True, env=env)
t1 = time.time()
m = re.search(r"END ([0-9.]+) destroy_process_group ([0-9.]+)", p.stdout)
print("FAST_EXIT", repr(sys.argv[1]), "total", round(t1 - t0, 2), "destroy", m and m.group(2), "END->torchrun gone", m and round(t1 - float(m.group(1)), 2), p.returncode, p.stderr[-300:] if p.returncode else "")
PY
done
for f in $OUT/*.speedscope.json; do python3 tools/gpu/spy_stages.py $f --min-s 0.4 > ${f%.speedscope.json}.timeline.txt; done
python3 tools/gpu/summary.py
cat $OUT/*.timeline.txt > $REAL_OUT/timelines.txt
tar czf $REAL_OUT/diag.tgz -C /tmp/d . ; tar czf $REAL_OUT/runs.tgz results/runs logs; ls -la $REAL_OUT
#tar czf $REAL_OUT/diag.tgz -C /tmp/d . ; tar czf $REAL_OUT/runs.tgz results/runs logs; ls -la $REAL_OUT
