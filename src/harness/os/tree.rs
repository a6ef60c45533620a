//! The process tree as the kernel shows it in `/proc`: each process's children, and a rank's own
//! processes (itself and everything below it that is not another rank's). Plain reads, no
//! judgement.

use std::collections::BTreeMap;

use crate::probe::memory;

/// Each process's living children, by parent pid (zombies left out).
pub fn children_of(table: &[memory::ProcStat]) -> BTreeMap<u32, Vec<u32>> {
    table.iter().filter(|p| !p.zombie()).fold(BTreeMap::new(), |mut map, p| {
        map.entry(p.ppid).or_default().push(p.pid);
        map
    })
}

/// The process `pid` and everything below it, except other ranks (`others`) and what is below
/// them: a rank's own processes (its DataLoader workers), whatever their process group.
pub fn rank_members(pid: u32, others: &[u32]) -> Vec<u32> {
    rank_members_in(&memory::processes(), pid, others)
}

/// [`rank_members`] in a process table already read.
pub fn rank_members_in(table: &[memory::ProcStat], pid: u32, others: &[u32]) -> Vec<u32> {
    let children = children_of(table);
    let mut members = vec![pid];
    let mut queue = vec![pid];
    while let Some(p) = queue.pop() {
        for &child in children.get(&p).into_iter().flatten() {
            if !others.contains(&child) {
                members.push(child);
                queue.push(child);
            }
        }
    }
    members.sort_unstable();
    members
}
