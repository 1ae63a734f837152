"""A one-node Slurm in a folder, for tests/test_slurm.py: MariaDB, munge, slurmdbd, slurmctld and
slurmd from Debian's packages (slurm-wlm, munge, slurmdbd, mariadb-server), each started in the
foreground by this process and stopped by its process id; every file (configuration, state,
logs, sockets, the database) lives under one folder. The node has as many CPUs as this machine
and `gpus` fake GPUs (gres.conf names a file for each: enough for `sbatch --gpus=N` to be
scheduled; nothing uses them).

    python3 tests/slurm_cluster.py install        # apt-get install the packages (.ci/run does)
    python3 tests/slurm_cluster.py up /tmp/slurm  # bring it up by hand; Ctrl-C stops it
    (in another shell; kill -TERM <its pid> stops it) export SLURM_CONF=/tmp/slurm/etc/slurm.conf; sinfo; sbatch ...

It needs root (the daemons run as root and write their state here) and the packages; `missing()`
says why it cannot start on this machine, and `install()` installs them with apt-get.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

PACKAGES = ("slurm-wlm", "munge", "slurmdbd", "mariadb-server")
# the programs each package brings, run from PATH or /usr/sbin
PROGRAMS = ("slurmctld", "slurmd", "slurmdbd", "munged", "mariadbd", "mariadb-install-db", "mariadb",
            "sbatch", "sacct", "sacctmgr", "squeue", "sinfo")
SBIN = ("/usr/sbin", "/usr/bin", "/sbin", "/bin")
PARTITION = "debug"
CLUSTER = "lmperf"


def which(program: str) -> str | None:
    return shutil.which(program) or shutil.which(program, path=os.pathsep.join(SBIN))


def missing() -> str | None:
    """Why a cluster cannot be started here, or None when it can."""
    if sys.platform != "linux":
        return f"a one-node Slurm needs Linux, this is {sys.platform}"
    if os.geteuid() != 0:
        return "a one-node Slurm needs root (its daemons run as root)"
    absent = [p for p in PROGRAMS if not which(p)]
    if absent:
        return (f"a one-node Slurm needs Debian's {' '.join(PACKAGES)}: {', '.join(absent)} not found "
                f"(apt-get install -y {' '.join(PACKAGES)})")
    return None


def install() -> str | None:
    """Install the packages with apt-get where a program is missing (root and apt-get needed);
    None when they are all there afterwards, else why not."""
    if not missing():
        return None
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return f"cannot install {' '.join(PACKAGES)}: apt-get as root is needed ({missing()})"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for args in (["apt-get", "update"], ["apt-get", "install", "-y", "--no-install-recommends", *PACKAGES]):
        proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            return f"{' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()[-500:]}"
    return missing()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def meminfo_mb() -> int:
    with open("/proc/meminfo") as f:
        kib = next(int(line.split()[1]) for line in f if line.startswith("MemTotal:"))
    return kib // 1024


class SlurmCluster:
    """One node, one partition (`debug`), accounting in slurmdbd over MariaDB. `env` holds what a
    client (sbatch, sacct, Snakemake's plugin) needs besides the environment: SLURM_CONF, USER."""

    def __init__(self, root: Path, gpus: int = 2, cpus: int | None = None, mem_mb: int | None = None):
        self.root = Path(root).resolve()
        self.gpus = gpus
        self.cpus = cpus or os.cpu_count()
        self.mem_mb = mem_mb or meminfo_mb() * 3 // 4
        self.node = socket.gethostname().split(".")[0]
        self.procs: dict[str, subprocess.Popen] = {}
        self.conf = self.root / "etc" / "slurm.conf"
        self.env = {"SLURM_CONF": str(self.conf), "USER": os.environ.get("USER") or "root"}

    # -- configuration -------------------------------------------------------------------------

    def _write_config(self) -> None:
        r = self.root
        for d in ("etc", "db", "munge", "state", "spool", "log", "run", "dev"):
            (r / d).mkdir(parents=True, exist_ok=True)
        os.chmod(r / "munge", 0o755)  # munged: clients need to reach its socket
        self.db_port, self.dbd_port, self.ctld_port, self.slurmd_port = (free_port() for _ in range(4))
        for i in range(self.gpus):
            (r / "dev" / f"nvidia{i}").touch()
        key = r / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        auth = f"AuthType=auth/munge\nAuthInfo=socket={r}/munge/munge.socket\n"
        self.conf.write_text(
            f"ClusterName={CLUSTER}\nSlurmctldHost={self.node}(127.0.0.1)\n"
            f"SlurmctldPort={self.ctld_port}\nSlurmdPort={self.slurmd_port}\n{auth}"
            "SlurmUser=root\nSlurmdUser=root\n"
            f"StateSaveLocation={r}/state\nSlurmdSpoolDir={r}/spool\n"
            f"SlurmctldPidFile={r}/run/slurmctld.pid\nSlurmdPidFile={r}/run/slurmd.pid\n"
            f"SlurmctldLogFile={r}/log/slurmctld.log\nSlurmdLogFile={r}/log/slurmd.log\n"
            "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nJobAcctGatherType=jobacct_gather/none\n"
            "MpiDefault=none\nReturnToService=2\nSchedulerType=sched/backfill\n"
            "SelectType=select/cons_tres\nSelectTypeParameters=CR_CPU_Memory\n"
            "SchedulerParameters=sched_interval=2\n"
            "AccountingStorageType=accounting_storage/slurmdbd\n"
            f"AccountingStorageHost=127.0.0.1\nAccountingStoragePort={self.dbd_port}\n"
            # the munge socket of the connection to slurmdbd (AuthInfo is for the others)
            f"AccountingStoragePass={r}/munge/munge.socket\n"
            "AccountingStorageTRES=gres/gpu\nAccountingStoreFlags=job_comment\nJobCompType=jobcomp/none\n"
            "GresTypes=gpu\nInactiveLimit=0\nKillWait=5\nMinJobAge=300\nSlurmctldTimeout=30\nSlurmdTimeout=30\n"
            f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory={self.mem_mb} "
            f"Gres=gpu:{self.gpus} State=UNKNOWN\n"
            f"PartitionName={PARTITION} Nodes={self.node} Default=YES MaxTime=INFINITE State=UP\n")
        (r / "etc" / "gres.conf").write_text(
            f"AutoDetect=off\nNodeName={self.node} Name=gpu File={r}/dev/nvidia[0-{self.gpus - 1}]\n")
        dbd = r / "etc" / "slurmdbd.conf"
        dbd.write_text(
            f"{auth}DbdHost={self.node}\nDbdAddr=127.0.0.1\nDbdPort={self.dbd_port}\nSlurmUser=root\n"
            f"LogFile={r}/log/slurmdbd.log\nPidFile={r}/run/slurmdbd.pid\n"
            "StorageType=accounting_storage/mysql\nStorageHost=127.0.0.1\n"
            f"StoragePort={self.db_port}\nStorageUser=slurm\nStoragePass=slurm\nStorageLoc=slurm_acct_db\n")
        os.chmod(dbd, 0o600)

    # -- daemons -------------------------------------------------------------------------------

    def _start(self, name: str, args: list[str]) -> subprocess.Popen:
        log = open(self.root / "log" / f"{name}.out", "ab")
        proc = subprocess.Popen([which(args[0]), *args[1:]], stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env={**os.environ, **self.env},
                                start_new_session=True)
        log.close()
        self.procs[name] = proc
        return proc

    def _wait(self, what: str, ready, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            if dead:
                raise RuntimeError(f"{', '.join(dead)} exited while waiting for {what}:\n{self.logs()}")
            if ready():
                return
            time.sleep(0.5)
        raise RuntimeError(f"timed out waiting for {what}:\n{self.logs()}")

    def _ok(self, *args: str) -> bool:
        try:
            return subprocess.run([which(args[0]), *args[1:]], env={**os.environ, **self.env},
                                  capture_output=True, timeout=30).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    def run(self, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        proc = subprocess.run([which(args[0]), *args[1:]], env={**os.environ, **self.env}, capture_output=True,
                              text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed ({proc.returncode}): {proc.stdout}{proc.stderr}")
        return proc

    def start(self) -> "SlurmCluster":
        r = self.root
        self._write_config()
        out = subprocess.run([which("mariadb-install-db"), "--user=root", f"--datadir={r}/db",
                              "--auth-root-authentication-method=normal", "--skip-test-db"],
                             capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"mariadb-install-db failed: {out.stdout}{out.stderr}")
        sock = f"{r}/run/mariadb.sock"
        self._start("mariadbd", ["mariadbd", "--no-defaults", "--user=root", f"--datadir={r}/db",
                                 f"--socket={sock}", f"--port={self.db_port}", "--bind-address=127.0.0.1",
                                 f"--pid-file={r}/run/mariadbd.pid", "--innodb-buffer-pool-size=128M",
                                 "--innodb-lock-wait-timeout=900"])
        self._wait("MariaDB", lambda: self._ok("mariadb", f"--socket={sock}", "-uroot", "-e", "select 1"))
        self.run("mariadb", f"--socket={sock}", "-uroot", "-e",
                 "CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm'; "
                 "CREATE USER 'slurm'@'localhost' IDENTIFIED BY 'slurm'; "
                 "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1'; "
                 "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';")
        self._start("munged", ["munged", "--foreground", "--force", f"--socket={r}/munge/munge.socket",
                               f"--key-file={r}/munge/munge.key", f"--pid-file={r}/munge/munged.pid",
                               f"--log-file={r}/log/munged.log", f"--seed-file={r}/munge/munged.seed"])
        self._wait("munged", lambda: Path(f"{r}/munge/munge.socket").exists())
        self._start("slurmdbd", ["slurmdbd", "-D"])
        self._wait("slurmdbd", lambda: self._ok("sacctmgr", "-n", "list", "cluster"))
        self.run("sacctmgr", "-i", "add", "cluster", CLUSTER)
        self.run("sacctmgr", "-i", "add", "account", "lmperf", "Description=lmperf", "Organization=lmperf")
        self.run("sacctmgr", "-i", "add", "user", self.env["USER"], "Account=lmperf", "DefaultAccount=lmperf")
        self._start("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
        self._wait("slurmctld", lambda: self._ok("scontrol", "ping"))
        self._start("slurmd", ["slurmd", "-D", "-f", str(self.conf), "-N", self.node])
        self._wait(f"node {self.node} idle", lambda: "idle" in self.run(
            "sinfo", "-h", "-N", "-o", "%T", check=False).stdout)
        return self

    def stop(self) -> None:
        """Stop the daemons in reverse order of start, each by its process id: SIGTERM, then
        SIGKILL after 30 s."""
        for name, proc in reversed(list(self.procs.items())):
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    os.kill(proc.pid, signal.SIGKILL)
                    proc.wait(10)
        self.procs.clear()

    def logs(self, tail: int = 3000) -> str:
        out = []
        for path in sorted((self.root / "log").glob("*")):
            text = path.read_text(errors="replace")[-tail:]
            out.append(f"--- {path.name}\n{text}")
        return "\n".join(out)

    def sacct(self) -> list[dict]:
        """Every job of this cluster's accounting, one dict a job (allocations only, no steps)."""
        fields = ["JobID", "JobName", "State", "ExitCode", "Comment", "AllocTRES", "Elapsed", "Start", "End"]
        out = self.run("sacct", "-X", "-a", "--parsable2", "-n", "--starttime", "2000-01-01",
                       "-o", ",".join(fields)).stdout
        return [dict(zip(fields, line.split("|"))) for line in out.splitlines() if line]

    def __enter__(self):
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc):
        self.stop()


def main(argv: list[str]) -> int:
    if argv[:1] == ["install"]:
        why = install()
        print(f"slurm_cluster: {why}" if why else f"slurm_cluster: {' '.join(PACKAGES)} installed",
              file=sys.stderr)
        return 1 if why else 0
    if argv[:1] != ["up"] or len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    why = missing()
    if why:
        print(f"slurm_cluster: {why}", file=sys.stderr)
        return 1
    # Ctrl-C or SIGTERM stops the daemons (a shell's background job ignores SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with SlurmCluster(Path(argv[1])) as cluster:
        print(f"export SLURM_CONF={cluster.conf}", flush=True)
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
