// Command bench runs kubectl-ichor's benchmarks against local simulated
// clusters (make bench, through hack/bench.sh): `bench [flags] plan upgrade
// talos`.
// It never fails on a timing: it measures, writes the figures and says which
// targets were met; it fails only when a cluster does not start, the plugin
// does not produce a plan or the upgrade does not succeed.
//
// The plan benchmark starts a cluster of each size (3 control planes and the
// rest workers) with ichor-sim, then runs
//
//	kubectl-ichor plan kubernetes --to v1.37.2 -o json --request-stats
//
// a number of times, measuring each run's wall time, peak resident memory
// (the child's rusage) and CPU time, and reading the Kubernetes request and
// Talos call counts the plugin's hidden --request-stats flag prints. It
// writes OUT/plan.json and the summary OUT/plan.txt (also printed).
//
// The upgrade benchmark starts a cluster of each size with fixed simulated
// latencies and the Job's image run as a local process, adds a workload for
// the drains to evict, and runs
//
//	kubectl-ichor upgrade kubernetes --to v1.37.2 --yes --max-unavailable 5
//
// as the Job's local-cluster tests launch it, and holds its wall time
// against the critical path's lower bound. It reads what happened from
// records that are none of them the plugin's own output: the simulator's
// events.jsonl, the state ConfigMap's node timelines, the runner pods' logs
// and their resource usage. Side by side (--compare, the default), each on a
// cluster of its own started identically (size, versions, latencies,
// workload), it runs kubectl-ichor one worker at a time (--max-unavailable 1,
// as the peer moves its kubelets) and the peer, talosctl upgrade-k8s, and
// reports both walls and their ratio. It writes OUT/upgrade.json, the summary
// OUT/upgrade.txt (also printed) and a timeline of each run,
// OUT/timeline-<nodes>-nodes-{mu<N>,talosctl}.svg.
//
// The talos benchmark is the upgrade benchmark's run for a Talos OS upgrade,
//
//	kubectl-ichor upgrade talos --to v1.14.1 --yes --max-unavailable 5
//
// of a cluster at Talos v1.13.9 (Kubernetes v1.36.3), measured and reported
// alike against its own lower bound (every node's install, reboot and
// readiness, the drains at --max-unavailable), with no peer beside it. It
// writes OUT/talos.json, OUT/talos.txt and OUT/timeline-talos-*.svg.
//
// The files, each one job:
//
//   - main.go: the command line;
//   - suite.go: what every benchmark shares: the sizes in turn, a local
//     cluster started, settled and stopped (its logs kept when it failed),
//     the report written;
//   - report.go: the figures' shared shapes (the machine, a spread of runs,
//     rounding, request breakdowns);
//   - plan.go, plan_report.go: the plan benchmark and its report;
//   - bound.go: the simulated latencies and the upgrades' lower bounds;
//   - kind.go: what differs between the Kubernetes and the Talos upgrade
//     benchmarks;
//   - upgrade.go: the upgrade benchmark, one cluster per run, the command
//     launched and timed;
//   - measure.go: what the records say of a finished upgrade: the stages'
//     times, the gaps between nodes;
//   - runner.go: the runner pods' logs and usage;
//   - peer.go: the peer, talosctl upgrade-k8s, run and timed;
//   - upgrade_report.go: upgrade.json, the verdicts and upgrade.txt;
//   - estimate.go: the estimates of the time left, followed as a script would;
//   - timeline.go, svg.go: a run's steps per node and their picture.
package main
