package engine

import (
	"context"
	"fmt"
	"time"

	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
)

// This file is the contract between the upgrade engine (this package) and
// the runner that drives it in the Job (pkg/job). The engine holds no state
// of its own that it cannot re-derive from the cluster: every call compares
// each node's active config with the render for the current stage and either
// applies or only verifies. The little it must remember across a pod restart
// (a Talos node's boot ID before its Upgrade call) goes through Memo, which
// the runner backs with the state ConfigMap.

// Kind is the kind of an upgrade.
type Kind string

// The kinds of upgrade.
const (
	KindKubernetes Kind = "kubernetes"
	KindTalos      Kind = "talos"
)

// NodePhase is where a node is in the current stage.
type NodePhase string

// Node phases, in the order a node goes through them.
const (
	PhasePending   NodePhase = "Pending"
	PhaseCordoned  NodePhase = "Cordoned"
	PhaseDraining  NodePhase = "Draining"
	PhaseApplying  NodePhase = "Applying"
	PhaseUpgrading NodePhase = "Upgrading" // a Talos upgrade: the Upgrade call, then the reboot
	PhaseVerifying NodePhase = "Verifying"
	PhaseDone      NodePhase = "Done"
	PhaseFailed    NodePhase = "Failed"
	PhaseHeld      NodePhase = "Held"
)

// Progress receives the engine's progress. Calls come from one goroutine at
// a time per node; implementations must be safe for concurrent use (workers
// of one batch move in parallel). A nil Progress is allowed.
type Progress interface {
	// Stage is called when a stage begins (index from 1).
	Stage(index, total int, name string)
	// Node is called on every phase change of a node, with a one-line
	// message (what was done or what is awaited).
	Node(stage, node string, phase NodePhase, message string)
}

// Memo is a small durable key/value store. Set returns only once the value
// is durable (written to the state ConfigMap), so a restarted runner sees it.
type Memo interface {
	Get(key string) (string, bool)
	Set(ctx context.Context, key, value string) error
}

// Options configure one upgrade.
type Options struct {
	Kind Kind
	// Target is the version to reach (vX.Y.Z).
	Target string
	// Installers are the operator's explicit Talos installers (KindTalos;
	// none: each node's is chosen from what it runs, ChooseInstaller).
	Installers stages.InstallerFlags
	// MaxUnavailable is how many workers move at once (>= 1).
	MaxUnavailable int
	// AllowEtcdOutage accepts that rebooting a control plane of a one- or
	// two-member etcd loses quorum (KindTalos): without it such a reboot is
	// refused.
	AllowEtcdOutage bool
	// Self is the node the runner runs on: it goes last in its group.
	Self string
	// SelfPod is the runner's own pod, "namespace/name": the drain of Self
	// evicts it only once every other pod of the node is gone (see
	// kube.Drainer.Last). Empty outside a pod.
	SelfPod string
	// ManifestsForce lists the bootstrap manifest objects ("Kind namespace/name") whose
	// fields owned by another field manager the sync takes over; "all" for every one.
	// The others are skipped and said.
	ManifestsForce []string
	// StayOnNode keeps SelfPod through the drain of Self instead of evicting
	// it last: the runner's pod tolerates the cordon because no other node
	// can host it, so a replacement would come back to Self. The runner then
	// reboots (or restarts the kubelet of) its own node and the Job's next pod
	// continues from the state.
	StayOnNode bool

	// Bounds. Zero values take the defaults below.
	ApplyTimeout   time.Duration // one ApplyConfiguration call (a control-plane apply blocks while static pods restart)
	VerifyTimeout  time.Duration // a node's verification after its apply
	DrainTimeout   time.Duration // one node's drain
	UpgradeTimeout time.Duration // one Talos Upgrade call (pulls and installs)
	RebootTimeout  time.Duration // a Talos node coming back after its reboot
	PullTimeout    time.Duration // one node's pre-pull of a stage's images (its images at once; each node its own bound)
	RenderTimeout  time.Duration // Talos re-rendering the bootstrap manifests for the target after an apply
	// RolloutStuckAfter is how long the kube-proxy rollout may stay blocked (NotReady
	// nodes hold its unavailable slots: kube.DaemonSetBlocked) before the stage pauses
	// on it, rather than wait out VerifyTimeout.
	RolloutStuckAfter time.Duration
	// MirrorPodTimeout is how long an invariant check waits for a control plane's
	// missing kube-apiserver mirror pod before it pauses: a kubelet that restarted
	// on a new version deletes and recreates its mirror pods.
	MirrorPodTimeout time.Duration
	// StaticPodSettle is how long, after a control plane's kubelet moved to a new
	// version, its static pods must stay Ready before the next node, unless that
	// kubelet already restarted them (it may: see settleStaticPods).
	StaticPodSettle time.Duration
	Concurrency     int // parallel Talos reads (the nodes' versions and configs)
	// PullConcurrency is how many nodes pre-pull at once (each pulls its
	// images together, under its own PullTimeout).
	PullConcurrency int
}

// Default bounds.
const (
	DefaultApplyTimeout     = 5 * time.Minute
	DefaultVerifyTimeout    = 20 * time.Minute
	DefaultDrainTimeout     = 5 * time.Minute
	DefaultUpgradeTimeout   = 10 * time.Minute
	DefaultRebootTimeout    = 20 * time.Minute
	DefaultPullTimeout      = 5 * time.Minute
	DefaultRenderTimeout    = 2 * time.Minute
	DefaultMirrorPodTimeout = 2 * time.Minute
	DefaultStaticPodSettle  = 30 * time.Second
	DefaultConcurrency      = 32
	DefaultPullConcurrency  = 32
)

// DefaultRolloutStuckAfter is Options.RolloutStuckAfter's default: it outlasts a
// node's short NotReady (a kubelet restart).
const DefaultRolloutStuckAfter = time.Minute

// PauseError is how the engine stops on a failure: the operation pauses with
// this reason, and resuming it continues from the cluster's state. Nothing is
// skipped: the failed node is tried again on resume.
type PauseError struct {
	Stage string
	Node  string // empty for a stage-wide step (manifest sync, rollout)
	// Reason is one line: what failed.
	Reason string
	// Action is one line: what the operator should do before resuming.
	Action string
	Err    error
}

func (e *PauseError) Error() string {
	where := e.Stage
	if e.Node != "" {
		where += " " + e.Node
	}
	msg := fmt.Sprintf("%s: %s", where, e.Reason)
	if e.Action != "" {
		msg += ": " + e.Action
	}
	return msg
}

func (e *PauseError) Unwrap() error { return e.Err }
