// Package progress says how far an upgrade operation has come and how long
// it should still take: nodes done out of the plan's per stage, the time
// elapsed, and an estimate of the time left from the plan's critical path
// (stages in order, control planes one at a time, workers a batch at a
// time) fed with what the operation has measured so far. The path holds
// the batches of nodes left, and the work the plan knows will happen
// besides them: the kube-proxy DaemonSet's rollout after the KubeProxy
// stage and the runner's replacement when its own node is drained. What is
// measured comes from the operation's status (node timelines, the stages'
// step records, the runners' starts and ends), so a resumed operation keeps
// it; what is not measured yet comes from priors taken from the same
// status (a pod's start on this cluster, the Job controller's backoff).
package progress
