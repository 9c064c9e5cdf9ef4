package v1alpha1

// KindUpgradePath is the kind of the UpgradePath document.
const KindUpgradePath = "UpgradePath"

// Where a hop's version came from (Hop.Source).
const (
	// SourceTarget is the operator's target (the last hop of its kind).
	SourceTarget = "target"
	// SourceVia is a release the operator named for that minor (--via).
	SourceVia = "via"
	// SourceRegistry is the newest patch of that minor found in the registry the nodes'
	// images come from (their repositories kept, a private mirror asked).
	SourceRegistry = "registry"
)

// UpgradePath is the path from where the cluster is to where the operator wants it: the
// hops, in order, each an ordinary Kubernetes upgrade of one minor (or a patch) or Talos
// upgrade, each legal when it starts by machinery's tables.
type UpgradePath struct {
	// APIVersion is always APIVersion.
	APIVersion string `json:"apiVersion"`
	// Kind is always KindUpgradePath.
	Kind string `json:"kind"`
	// Targets are the versions asked for.
	Targets PathTargets `json:"targets"`
	// Via are the intermediate releases the operator named, vX.Y.Z.
	Via []string `json:"via,omitempty"`
	// Start is what the cluster runs where the path starts (held nodes apart).
	Start PathVersions `json:"start"`
	// Held are nodes excluded by the ichor.dev/hold annotation: no hop moves them.
	Held []NodeNote `json:"held,omitempty"`
	// Hops are run in this order; empty when the cluster is there already or the path
	// is refused.
	Hops []Hop `json:"hops"`
	// Checks are the path's own checks (the "path" row: found, or refused with the
	// reason).
	Checks []Check `json:"checks"`
	// Runnable is false when any check refused.
	Runnable bool `json:"runnable"`
	// EstimateSeconds is how long the whole path should take, the sum of its hops'
	// estimates; absent when a hop has none.
	EstimateSeconds *int64 `json:"estimateSeconds,omitempty"`
	// EstimateBasis says what the estimates were made from (the upgrades of this
	// cluster's history), or why there is none.
	EstimateBasis string `json:"estimateBasis,omitempty"`
}

// PathTargets are the versions a path goes to; an empty one is left as the cluster runs
// it.
type PathTargets struct {
	// Talos is the Talos target, vX.Y.Z.
	Talos string `json:"talos,omitempty"`
	// Kubernetes is the Kubernetes target, vX.Y.Z.
	Kubernetes string `json:"kubernetes,omitempty"`
}

// PathVersions are the versions a cluster runs.
type PathVersions struct {
	// Talos lists the Talos versions the nodes run, oldest first, with how many nodes
	// run each.
	Talos []VersionCount `json:"talos,omitempty"`
	// Kubernetes lists the Kubernetes versions the nodes' components run, oldest first,
	// with how many nodes run each (a node with several versions counts in each).
	Kubernetes []VersionCount `json:"kubernetes,omitempty"`
}

// Hop is one upgrade of a path.
type Hop struct {
	// Number numbers the hop from 1.
	Number int `json:"number"`
	// Upgrade is UpgradeKubernetes or UpgradeTalos.
	Upgrade string `json:"upgrade"`
	// From are the versions of its kind the cluster runs when the hop starts, oldest
	// first.
	From []string `json:"from"`
	// To is the version the hop goes to, vX.Y.Z.
	To string `json:"to"`
	// Source says where To came from: SourceTarget, SourceVia or SourceRegistry.
	Source string `json:"source"`
	// SourceDetail says more of where, in one line (the repositories asked).
	SourceDetail string `json:"sourceDetail,omitempty"`
	// Reason says why the hop is legal when it starts, in one line.
	Reason string `json:"reason"`
	// EstimateSeconds is how long the hop should take: the median of the upgrades of
	// its kind in the cluster's history; absent when there was none.
	EstimateSeconds *int64 `json:"estimateSeconds,omitempty"`
	// Plan is the hop's plan (its stages, checks and drains, as `kubectl ichor plan
	// kubernetes|talos` prints it), when it was made; absent otherwise.
	Plan *Plan `json:"plan,omitempty"`
}
