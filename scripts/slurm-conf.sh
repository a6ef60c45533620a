# Sourced by scripts/slurm-one-host.sh and scripts/hosts.sh: the slurm.conf lines their test
# clusters share, every file under DIR.
#
#   slurm_conf_common DIR SLURMD_NAME   prints them; SLURMD_NAME names slurmd's pid and log files
#                                       (`slurmd`, or `slurmd-%n` for one per node)
#
# Choices: root daemons without systemd; ProctrackType=proctrack/linuxproc and TaskPlugin=task/none,
# so that Slurm makes no cgroup of its own (ups-doctor puts every scenario in its own cgroup); no
# accounting; a node that comes back is used again at once.
slurm_conf_common() {
  local dir=$1 slurmd=$2
  cat <<EOF2
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge.socket
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/$slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/$slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
MailProg=/bin/true
SwitchType=switch/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=10
EOF2
}
