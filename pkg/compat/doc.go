// Package compat owns the version rules: which Kubernetes and Talos versions may run
// together and which may follow which, answered from the tables built into Talos'
// machinery (compatibility.KubernetesVersion.SupportedWith and
// compatibility.TalosVersion.UpgradeableFrom), never from a table written here. The plan
// (a check row) and the engine (a pause) ask the same predicates, so they cannot
// disagree; and the path planner (path.go) chains the hops those predicates allow.
//
// The rules, each a function of the cluster ([]Node, held nodes apart) and a target
// that returns a Verdict (one line of detail, one of action, the nodes refused):
//   - KubernetesStep: one Kubernetes minor at a time and no downgrade, judged for every
//     component every node runs against what it runs;
//   - KubernetesSupported: Kubernetes K is supported by every node's Talos;
//   - TalosUpgradeable: Talos T may be installed from each node's Talos;
//   - TalosSupports: Talos T supports the Kubernetes the cluster runs.
//
// Supports, Upgradeable and Step answer the same questions for one pair of versions
// (the engine's check of one node at its turn).
//
// Decisions:
//   - Versions are strict vX.Y.Z. A -rc/-beta tag or a Talos pre-release is refused as
//     unreadable, not judged as the release it precedes; a digest after a tag
//     (image:v1.36.3@sha256:...) is read by its tag, a digest-only image is unreadable.
//   - What machinery knows is found by asking it, minor by minor (TalosMinors,
//     KubernetesRange): a newer machinery brings its new minors with no change here. A
//     Talos minor it does not know is an *UnknownTalosError: "newer than this build
//     knows" says to upgrade kubectl-ichor; one older than its tables says to upgrade
//     Talos with talosctl first.
//   - A held node is judged by no rule: nothing moves it. A node whose Talos was not
//     read (not Talos) is skipped by the Talos rules; the checks that refuse non-Talos
//     nodes are not version rules.
//   - "The Kubernetes the cluster runs" is every version read per node: its kubelet, each
//     image of its machine config (what Talos starts after a reboot) and each mirror pod
//     (what runs now), as FromSnapshot reads them.
//   - The machine-readable text is the plan's: the rows `kubectl ichor plan` printed
//     before this package keep their wording, so automation reading them sees no change.
package compat
