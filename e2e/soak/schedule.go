package soak

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/ichor-dev/kubectl-ichor/e2e/sim/faults"
)

// Shape is a cluster's size.
type Shape struct {
	ControlPlanes int `json:"controlPlanes"`
	Workers       int `json:"workers"`
}

func (s Shape) String() string { return fmt.Sprintf("%d+%d", s.ControlPlanes, s.Workers) }

// Nodes are the shape's node names, control planes first, as the simulator
// names them.
func (s Shape) Nodes() []string {
	var out []string
	for i := range s.ControlPlanes {
		out = append(out, fmt.Sprintf("cp-%d", i+1))
	}
	for i := range s.Workers {
		out = append(out, fmt.Sprintf("worker-%d", i+1))
	}
	return out
}

// Shapes are the shapes a run picks from.
var Shapes = []Shape{{1, 0}, {3, 0}, {3, 2}, {3, 5}}

// The upgrades of a Scenario.
const (
	Kubernetes = "kubernetes"
	TalosOS    = "talos"
	// Path is `upgrade cluster`: a Talos hop, then a Kubernetes hop, as one
	// operation.
	Path = "cluster"
)

// Scenario is a cluster's versions and config layout and the upgrade a run
// makes of it: pairs the simulator serves and the product supports.
type Scenario struct {
	Upgrade    string `json:"upgrade"` // Kubernetes, TalosOS or Path
	Talos      string `json:"talos"`
	Kubernetes string `json:"kubernetes"`
	Layout     string `json:"layout,omitempty"` // ichor-sim --config-layout; "" is Talos' own
	// To is the target of a Kubernetes or Talos upgrade, and the Talos
	// target of a path; ToKubernetes the Kubernetes target of a path.
	To           string `json:"to"`
	ToKubernetes string `json:"toKubernetes,omitempty"`
}

func (s Scenario) String() string {
	layout := ""
	if s.Layout != "" {
		layout = ", " + s.Layout
	}
	switch s.Upgrade {
	case TalosOS:
		return fmt.Sprintf("talos %s -> %s (Kubernetes %s%s)", s.Talos, s.To, s.Kubernetes, layout)
	case Path:
		return fmt.Sprintf("cluster: Talos %s -> %s, Kubernetes %s -> %s%s", s.Talos, s.To, s.Kubernetes, s.ToKubernetes, layout)
	default:
		return fmt.Sprintf("kubernetes %s -> %s (Talos %s%s)", s.Kubernetes, s.To, s.Talos, layout)
	}
}

// TalosTarget is the Talos every node runs at the end, KubernetesTarget the
// Kubernetes.
func (s Scenario) TalosTarget() string {
	if s.Upgrade == Kubernetes {
		return s.Talos
	}
	return s.To
}

// KubernetesTarget is the Kubernetes every node runs at the end.
func (s Scenario) KubernetesTarget() string {
	switch s.Upgrade {
	case Kubernetes:
		return s.To
	case Path:
		return s.ToKubernetes
	default:
		return s.Kubernetes
	}
}

// Reboots tells whether the upgrade reboots nodes (a Talos upgrade, or a
// path with a Talos hop).
func (s Scenario) Reboots() bool { return s.Upgrade != Kubernetes }

// Changes tells whether the upgrade changes Kubernetes components.
func (s Scenario) Changes() bool { return s.Upgrade != TalosOS }

// Scenarios are the upgrades a run picks from.
var Scenarios = []Scenario{
	{Upgrade: Kubernetes, Talos: "v1.13.9", Kubernetes: "v1.35.4", To: "v1.36.3"},
	{Upgrade: Kubernetes, Talos: "v1.14.1", Kubernetes: "v1.36.3", Layout: "v1alpha1", To: "v1.37.2"},
	{Upgrade: Kubernetes, Talos: "v1.14.1", Kubernetes: "v1.36.3", Layout: "multi-doc", To: "v1.37.2"},
	{Upgrade: Kubernetes, Talos: "v1.14.1", Kubernetes: "v1.36.3", Layout: "mixed", To: "v1.37.2"},
	{Upgrade: TalosOS, Talos: "v1.12.4", Kubernetes: "v1.35.4", To: "v1.13.9"},
	{Upgrade: TalosOS, Talos: "v1.13.9", Kubernetes: "v1.36.3", To: "v1.14.1"},
	{Upgrade: TalosOS, Talos: "v1.14.0", Kubernetes: "v1.36.3", Layout: "multi-doc", To: "v1.14.1"},
	{Upgrade: TalosOS, Talos: "v1.14.0", Kubernetes: "v1.36.3", Layout: "mixed", To: "v1.14.1"},
	{Upgrade: Path, Talos: "v1.13.9", Kubernetes: "v1.36.3", To: "v1.14.1", ToKubernetes: "v1.37.2"},
}

// Kind is a kind of fault.
type Kind string

// The faults a run injects. Each names what it does to the cluster; those
// with a node last until cleared, the others happen once.
const (
	// RunnerKilled deletes the lock holder's pod with no grace period.
	RunnerKilled Kind = "runner-killed"
	// RunnerEvicted evicts the lock holder's pod (the Eviction API).
	RunnerEvicted Kind = "runner-evicted"
	// TalosUnavailable makes a node's Talos API refuse connections (gRPC
	// Unavailable): faults' unreachable.
	TalosUnavailable Kind = "talos-unavailable"
	// TalosSlow makes a node's Talos call answer past its caller's deadline:
	// an apply blocks (a Kubernetes upgrade, faults' applyBlocks) or an
	// install stalls before its reboot (a Talos upgrade, faults' installHangs).
	TalosSlow Kind = "talos-slow"
	// TalosStreamReset ends a node's Upgrade call with Unavailable after its
	// install (the stream reset): faults' upgradeUnavailable.
	TalosStreamReset Kind = "talos-stream-reset"
	// NodeCordoned is a person cordoning a node (kubectl cordon), and
	// uncordoning it when cleared.
	NodeCordoned Kind = "node-cordoned"
	// SecondOperation launches a second upgrade of the same kind and target.
	SecondOperation Kind = "second-operation"
	// EtcdStopped stops a control plane's etcd member (still listed):
	// faults' etcdStopped. Only with three control planes (one stopped keeps
	// quorum).
	EtcdStopped Kind = "etcd-stopped"
	// EtcdAlarm raises an alarm (NOSPACE) on a control plane's etcd member:
	// faults' etcdAlarm.
	EtcdAlarm Kind = "etcd-alarm"
	// NodeDrained is a person draining a node (kubectl drain: cordon, then
	// evict its pods), and uncordoning it when cleared.
	NodeDrained Kind = "node-drained"
	// RunnerNodeDrained is a person draining the node the lock holder's pod
	// runs on, found when the fault comes (its pod evicted with the rest),
	// and uncordoning it when cleared.
	RunnerNodeDrained Kind = "runner-node-drained"
	// NodePoweredOff cuts a node's power, and switches it on when cleared:
	// faults' poweredOff.
	NodePoweredOff Kind = "node-powered-off"
	// APIServerRestart stops the kube-apiserver, and starts it again when
	// cleared: faults' apiServerDown.
	APIServerRestart Kind = "apiserver-restart"
	// StateWriteDenied is an admission policy (a ValidatingAdmissionPolicy)
	// that denies every update of the state ConfigMap, removed when cleared.
	StateWriteDenied Kind = "state-write-denied"
	// PDBBlocking sets the workload's PodDisruptionBudget to allow no
	// disruption, and back when cleared (only with workers: the workload
	// runs on them).
	PDBBlocking Kind = "pdb-blocking"
	// FollowerInterrupted starts `kubectl ichor status --watch`, as an
	// operator follows the upgrade, and interrupts it (Ctrl-C) when cleared:
	// it must end at once and leave the operation running.
	FollowerInterrupted Kind = "follower-interrupted"
	// AllEtcdStopped stops every control plane's etcd member and never clears:
	// the self-check's fault, which the product cannot survive by design.
	AllEtcdStopped Kind = "all-etcd-stopped"
)

// ClusterWide tells whether a kind of fault has no node.
func (k Kind) ClusterWide() bool {
	switch k {
	case RunnerKilled, RunnerEvicted, SecondOperation, APIServerRestart, StateWriteDenied, PDBBlocking, FollowerInterrupted,
		RunnerNodeDrained: // its node is the runner's, found when it comes
		return true
	}
	return false
}

// Fault is one fault of a run's schedule.
type Fault struct {
	Kind Kind   `json:"kind"`
	Node string `json:"node,omitempty"`
	// At is when, from the launch of the upgrade.
	At faults.Duration `json:"at"`
	// For is how long until it is cleared; zero for a fault that happens once
	// (and for AllEtcdStopped: never cleared).
	For faults.Duration `json:"for,omitzero"`
}

func (f Fault) String() string {
	s := string(f.Kind)
	if f.Node != "" {
		s += " " + f.Node
	}
	s += " at " + f.At.String()
	if f.For.Duration > 0 {
		s += " for " + f.For.String()
	}
	return s
}

// Lasting reports whether the fault stays until cleared.
func (f Fault) Lasting() bool { return f.For.Duration > 0 || f.Kind == AllEtcdStopped }

// Run is one run's schedule.
type Run struct {
	Seed           uint64   `json:"seed"`
	Shape          Shape    `json:"shape"`
	Scenario       Scenario `json:"scenario"`
	MaxUnavailable int      `json:"maxUnavailable"`
	// SelfCheck marks the run whose fault the product cannot survive: it must
	// end paused with a reason.
	SelfCheck bool    `json:"selfCheck,omitempty"`
	Faults    []Fault `json:"faults"`
}

// The bounds of a schedule: when faults come (from the launch), how long a
// lasting one stays, how many a run gets.
const (
	window    = 60 * time.Second
	minFor    = 5 * time.Second
	maxFor    = 30 * time.Second
	maxFaults = 4
)

// kinds are the faults that fit a scenario on a shape.
func kinds(sc Scenario, sh Shape) []Kind {
	out := []Kind{RunnerKilled, RunnerEvicted, TalosUnavailable, TalosSlow, NodeCordoned, SecondOperation,
		EtcdAlarm, NodeDrained, NodePoweredOff, APIServerRestart, StateWriteDenied, FollowerInterrupted, RunnerNodeDrained}
	if sc.Reboots() {
		out = append(out, TalosStreamReset)
	}
	if sh.ControlPlanes >= 3 {
		out = append(out, EtcdStopped)
	}
	if sh.Workers > 0 {
		out = append(out, PDBBlocking)
	}
	return out
}

// Generate is the schedule of the run with seed: the same seed, the same run.
func Generate(seed uint64) Run {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	r := Run{
		Seed:     seed,
		Shape:    Shapes[rng.IntN(len(Shapes))],
		Scenario: Scenarios[rng.IntN(len(Scenarios))],
	}
	r.MaxUnavailable = 1
	if r.Shape.Workers > 1 {
		r.MaxUnavailable = 1 + rng.IntN(2)
	}
	nodes := r.Shape.Nodes()
	cps := nodes[:r.Shape.ControlPlanes]
	ks := kinds(r.Scenario, r.Shape)
	n := 1 + rng.IntN(maxFaults)
	for range n {
		f := Fault{Kind: ks[rng.IntN(len(ks))], At: faults.Duration{Duration: randDuration(rng, 0, window)}}
		switch f.Kind {
		case RunnerKilled, RunnerEvicted, SecondOperation:
		case APIServerRestart, StateWriteDenied, PDBBlocking, FollowerInterrupted, RunnerNodeDrained:
			f.For = faults.Duration{Duration: randDuration(rng, minFor, maxFor)}
		case EtcdStopped, EtcdAlarm:
			f.Node = cps[rng.IntN(len(cps))]
			f.For = faults.Duration{Duration: randDuration(rng, minFor, maxFor)}
		default:
			f.Node = nodes[rng.IntN(len(nodes))]
			f.For = faults.Duration{Duration: randDuration(rng, minFor, maxFor)}
		}
		r.Faults = append(r.Faults, f)
	}
	slices.SortStableFunc(r.Faults, func(a, b Fault) int { return cmp.Compare(a.At.Duration, b.At.Duration) })
	return r
}

// SelfCheck is the self-check run of seed: a Talos upgrade of three control
// planes whose every etcd member stops once the upgrade runs, and stays stopped.
func SelfCheck(seed uint64) Run {
	rng := rand.New(rand.NewPCG(seed, seed^0x5bd1e995))
	var talos []Scenario
	for _, s := range Scenarios {
		if s.Upgrade == TalosOS && s.Layout == "" {
			talos = append(talos, s)
		}
	}
	return Run{
		Seed:           seed,
		Shape:          Shape{ControlPlanes: 3, Workers: rng.IntN(3)},
		Scenario:       talos[rng.IntN(len(talos))],
		MaxUnavailable: 1,
		SelfCheck:      true,
		Faults:         []Fault{{Kind: AllEtcdStopped}},
	}
}

// randDuration is a duration in [lo, hi), to the tenth of a second.
func randDuration(rng *rand.Rand, lo, hi time.Duration) time.Duration {
	steps := int64((hi - lo) / (100 * time.Millisecond))
	return lo + time.Duration(rng.Int64N(steps))*100*time.Millisecond
}
