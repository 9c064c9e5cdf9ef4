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
//
// The path (Planner.Plan) is a breadth-first search over what the cluster runs between
// hops, so the first path found is a shortest one. Decisions:
//   - A hop is legal when it starts, judged with the same functions as the rules: a
//     Kubernetes hop moves every component at most one minor, to a version every node's
//     Talos then supports; a Talos hop goes to a version each node may upgrade to from
//     what it then runs and that supports every Kubernetes version the cluster then runs.
//   - Among the shortest paths, Talos first (through the releases the operator named,
//     else the newest legal Talos): Kubernetes then moves only as far as the next Talos
//     needs, as an operator would do it by hand.
//   - An absent target is "leave it as it runs": no hop of that kind is planned. A target
//     that needs the other kind to move (Kubernetes v1.37 on nodes of Talos 1.13) is
//     refused, naming the target to add, rather than an OS upgrade of every node nobody
//     asked for.
//   - Impossible requests are refused before the search, each with its reason: a
//     downgrade, a Talos minor this build does not know, a Kubernetes no Talos it knows
//     supports, targets that do not go together; and after it: no legal sequence (with
//     what blocks the furthest state reached).
//   - Intermediate releases: the operator's --via (one per minor, matched to the hop of
//     that minor; a --via the path does not use is refused, as a mistake about the
//     path), else a Resolver (pkg/releases: the newest patch tagged in the nodes' own
//     registry), else a refusal that names the --via to pass. The search judges minors
//     (machinery's bounds are X.Y.0 and X.Y.99), then the path is judged again with the
//     releases found: one older than a node's patch of that minor is refused there.
//   - A Talos intermediate has no default in machinery: its constants name only its own
//     release (gendata, v1.14.1), which is never an intermediate (an intermediate is
//     older than the target's minor, the target at most the build's minor). It comes
//     from --via or a Talos Resolver (the nodes' installer repository, or the Image
//     Factory's list of versions for nodes on a schematic).
//   - Each hop says where its version came from (target, via, registry) and why it is
//     legal; Document makes the UpgradePath document of api/v1alpha1.
package compat
