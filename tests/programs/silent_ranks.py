"""A silent program for ups-doctor's tests: it does not import python/ups_doctor.py (so no
markers and no death-with-parent), prints nothing, and waits forever. Each rank writes its pid
into `<dir>/rank<RANK>.pid` once it runs, so a test can wait for both ranks without sleeping."""

import os
import sys
import time

path = os.path.join(sys.argv[1], "rank%s.pid" % os.environ.get("RANK", "0"))
with open(path + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.rename(path + ".tmp", path)
while True:
    time.sleep(60)
