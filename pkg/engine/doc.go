// Package engine runs an upgrade against the cluster: the four stages of a Kubernetes
// upgrade and the one of a Talos OS upgrade, node by node, through the Talos API and
// the Kubernetes API (pkg/kube), for the runner in the Job (pkg/job). What is to be done
// (the stages, the node order, the versions, the invariant, each node's installer) is
// pkg/stages', a pure model; this package makes the calls and keeps the cluster safe
// while it does.
//
// engine.go is the whole contract: an Engine is a struct whose fields a caller sets
// (the clients, Options, Progress, Memo, Out), then Run. Run returns nil once every
// stage is done, a *PauseError (a Reason and the Action to take) when a step failed or a
// check refused, or ctx's error when ctx ended first. Nothing is ever skipped: resuming
// tries the same node again.
//
// Decisions:
//   - No state of its own. Every Run re-reads each node's active machine config and
//     compares it with the render for the current stage: a node that differs is
//     checked, dry-run and applied (NO_REBOOT, under its own deadline), one that is
//     equal is only verified, so a fresh Engine on a half-done cluster finishes it
//     without applying anything twice (kubernetes_loop.go, kubernetes_visit.go,
//     kubernetes_apply.go).
//   - The invariant is judged at a stage's start, predicted before each apply and each
//     manifest sync, and checked after them against what the cluster runs; no step may
//     make it worse (kubernetes_invariant.go). A control plane that joins mid-stage
//     restarts the stage, the newcomer first (kubernetes_joins.go).
//   - The engine asks a stage what it does (Drains, Rollout, AtTarget), never which
//     stage it is.
//   - The version checks before a stage (one minor at a time, the target supported by
//     the nodes' Talos; the Talos upgrade path, the Kubernetes the target Talos
//     supports) are pkg/compat's rules, the ones the plan's rows ask: a pause says
//     "checks: <row>: <the row's detail>" with the row's action (kubernetes_checks.go).
//   - The Talos OS upgrade visits the nodes in the same order with the same checks'
//     style: upgrade path and Kubernetes pairing (pkg/compat's rules),
//     node Ready, no staged machine config, etcd all voters on a control plane
//     (talos_checks.go). It cordons and drains the node itself (a Reboot after
//     LifecycleService.Upgrade does not drain) and records the node's boot ID in Memo
//     before the install (marks.go): the boot ID is all it keeps, and a new runner
//     resumes a node from it and the node's state.
//   - One install per node. Each Install and Reboot is announced in the node's mark
//     before it is made and gated again right before it (etcd, a staged config:
//     etcd_gate.go); what a run does with a node whose upgrade is under way is decide()
//     (talos_resume.go), from the node's boot ID, version and machined's log of the
//     installs of that boot, and only an install of the installer chosen for the node
//     is rebooted into (talos_foreign.go, talos_install.go).
//   - The reboot is followed by boot ID (talos_reboot.go): unreachable is rebooting,
//     the same ID is not yet, a new ID on the old version is an A/B fallback and
//     pauses. The node is done once Ready on the new osImage (on a control plane, etcd
//     all voters again) and running what its installer was to carry, then uncordoned.
//   - Every node's installer of a batch is pulled before the batch's first cordon
//     (talos_installer.go); a Kubernetes stage pre-pulls its images before its first
//     apply (kubernetes_checks.go, pull.go). Either pull is bounded per node.
//   - A held node is left alone, even one ichor cordoned in an earlier run, and named
//     while it stays cordoned (held.go). Both upgrades end with a last look at the
//     Nodes (left_behind.go): a node not held and still behind the target joined after
//     the stages read the cluster, and pauses the run, named, rather than be left
//     behind by a run that says it succeeded.
package engine
