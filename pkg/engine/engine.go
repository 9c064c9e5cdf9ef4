package engine

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/config"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/ichor-dev/kubectl-ichor/pkg/kube"
	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
	"github.com/ichor-dev/kubectl-ichor/pkg/talos"
)

// This file is the contract between the upgrade engine (this package) and
// the runner that drives it in the Job (pkg/job). The engine holds no state
// of its own that it cannot re-derive from the cluster: every call compares
// each node's active config with the render for the current stage and either
// applies or only verifies. The little it must remember across a pod restart
// (a Talos node's boot ID before its Upgrade call) goes through Memo, which
// the runner backs with the state ConfigMap.

// Engine runs one upgrade to completion, or until it pauses. It holds no
// state of its own: every Run re-derives where the upgrade is from the
// cluster (each node's active config against the render for the current
// stage), so a fresh Engine on a half-done cluster finishes it and never
// re-applies a node that is done.
//
// Set the fields, then call Run. An Engine is for one Run at a time.
type Engine struct {
	// Kube is the Kubernetes client.
	Kube kubernetes.Interface
	// Dynamic server-side applies the bootstrap manifests in the KubeProxy
	// stage (required for KindKubernetes).
	Dynamic dynamic.Interface
	// Talos is the Talos API of the cluster's nodes.
	Talos TalosClient
	// Options say what to upgrade to and the bounds.
	Options Options
	// Progress receives every stage and every node's phase changes; may be
	// nil.
	Progress Progress
	// Memo keeps what the engine must remember across a pod restart: the
	// Talos kind requires it (each node's boot ID before its Upgrade call);
	// the Kubernetes kind needs none, so it may be nil there.
	Memo Memo
	// Out, when not nil, receives the same progress as plain lines, one per
	// event (for logs).
	Out io.Writer
	// Nodes is the runner's watch of the Nodes, shared by its Runs; nil: each
	// Run starts one of its own. Every read and cordon of a Node goes through it.
	Nodes *kube.Nodes

	// nodes is the Run's: Nodes, or its own (stopped by stopNodes).
	nodes     *kube.Nodes
	stopNodes func()

	outMu sync.Mutex
	// evictRetryDelay overrides the drain's wait between evictions a budget
	// refused (tests).
	evictRetryDelay time.Duration
	// talosPoll overrides how often a Talos upgrade polls a node's Talos API
	// while it reboots (tests).
	talosPoll time.Duration
	// etcdGap overrides the gap between the two passes of an etcd read
	// (default EtcdProgressGap; tests shorten it).
	etcdGap time.Duration
}

// Run drives the upgrade. It returns nil once every stage is done, a
// *PauseError when a step failed or a check refused (nothing was skipped:
// resuming tries the same node again), or ctx's error, wrapped, when ctx
// ended first (a node may then be cordoned by ichor, which the next Run
// finishes first).
func (e *Engine) Run(ctx context.Context) error {
	opts := e.Options.withDefaults()

	defer func() {
		if e.stopNodes != nil {
			e.stopNodes()
		}

		e.nodes, e.stopNodes = nil, nil
	}()

	var (
		err  error
		last string // the last stage's name
	)

	switch opts.Kind {
	case KindKubernetes:
		err = e.runKubernetes(ctx, opts)
		all := stages.KubernetesStages()
		last = all[len(all)-1].Name()
	case KindTalos:
		err = e.runTalos(ctx, opts)
		last = stages.TalosOS{}.Name()
	default:
		return fmt.Errorf("unknown upgrade kind %q: want %q or %q", opts.Kind, KindKubernetes, KindTalos)
	}

	if err != nil || opts.PullOnly {
		return err
	}

	return e.reportHeldCordoned(ctx, last)
}

// watchNodes makes e.nodes the runner's watch of the Nodes, or starts one of
// the Run's own; a failure to start it pauses.
func (e *Engine) watchNodes(ctx context.Context) error {
	if e.nodes != nil {
		return nil
	}

	if e.Nodes != nil {
		e.nodes = e.Nodes

		return nil
	}

	nodes, err := kube.StartNodes(ctx, e.Kube)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("start: %w", ctx.Err())
		}

		return &PauseError{Reason: err.Error(), Action: actionResume, Err: err}
	}

	e.nodes, e.stopNodes = nodes, nodes.Stop

	return nil
}

// startCache starts the Run's Cache on its watch of the Nodes; a failure pauses.
func (e *Engine) startCache(ctx context.Context) (*kube.Cache, error) {
	if err := e.watchNodes(ctx); err != nil {
		return nil, err
	}

	c, err := kube.StartCache(ctx, e.Kube, e.nodes)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("start: %w", ctx.Err())
		}

		return nil, &PauseError{Reason: err.Error(), Action: actionResume, Err: err}
	}

	return c, nil
}

// TalosClient is the Talos API the Engine uses: one interface per upgrade
// kind, composed. *talos.Client satisfies it.
type TalosClient interface {
	KubernetesTalos
	OSTalos
}

// KubernetesTalos is the part of the Talos API the Kubernetes upgrade uses.
// Every call is addressed to one node by the address Talos routes it by (the
// Node's InternalIP); *talos.Client satisfies it.
type KubernetesTalos interface {
	// Version returns the Talos version the node runs, e.g. "v1.13.9".
	Version(ctx context.Context, node string) (string, error)
	// MachineConfig returns the node's active machine config.
	MachineConfig(ctx context.Context, node string) (config.Provider, error)
	// PersistentMachineConfig returns the config saved for the next boot
	// (nil when the node keeps none).
	PersistentMachineConfig(ctx context.Context, node string) (config.Provider, error)
	// Apply applies a machine config in mode NO_REBOOT (only checks it with
	// dryRun).
	Apply(ctx context.Context, node string, cfg []byte, dryRun bool) (talos.ApplyResult, error)
	// PullImage pulls an image on the node ahead of its use; an error
	// wrapping talos.ErrPullUnsupported means the node cannot.
	PullImage(ctx context.Context, node string, ns talos.ImageNamespace, ref string) error
	// Manifests returns the bootstrap manifests a control plane renders.
	Manifests(ctx context.Context, node string) ([]*unstructured.Unstructured, error)
}

// OSTalos is the part of the Talos API the Talos OS upgrade uses. Every call
// is addressed to one node by the address Talos routes it by (the Node's
// InternalIP); *talos.Client satisfies it.
type OSTalos interface {
	// Version returns the Talos version the node runs, e.g. "v1.13.9".
	Version(ctx context.Context, node string) (string, error)
	// MachineConfig returns the node's active machine config (for its
	// installer image, machine.install.image).
	MachineConfig(ctx context.Context, node string) (config.Provider, error)
	// BootID returns the ID of the node's current boot: it changes with
	// every reboot.
	BootID(ctx context.Context, node string) (string, error)
	// PersistentMachineConfig returns the config saved for the next boot
	// (nil when the node keeps none): one that differs from the active
	// config is a change staged for the reboot.
	PersistentMachineConfig(ctx context.Context, node string) (config.Provider, error)
	// EtcdReader reads etcd's members, each member's status and the alarms
	// through a control plane (see pkg/stages/etcd.go).
	stages.EtcdReader
	installTalos
	// Installed returns what the node's Talos was installed with: platform,
	// SecureBoot, system extensions and Image Factory schematic (the
	// ExtensionStatus resources), which its installer must keep; read again
	// after the reboot to check it kept them.
	Installed(ctx context.Context, node string) (talos.Installed, error)
	// PullImage pulls an image on the node (ImageService.Pull, else
	// MachineService.ImagePull): each node's installer before its batch is
	// cordoned. An error wrapping talos.ErrPullUnsupported means the node
	// can do neither.
	PullImage(ctx context.Context, node string, ns talos.ImageNamespace, ref string) error
}

// installTalos is the part of OSTalos that installs and reboots.
type installTalos interface {
	// Install installs the installer image's Talos into the node's other
	// boot slot; rebooting is true when the node reboots by itself (a Talos
	// without the lifecycle service).
	Install(ctx context.Context, node, image string) (rebooting bool, err error)
	// Reboot asks the node to reboot.
	Reboot(ctx context.Context, node string) error
	// InstallEvidence says what the node's machined log shows of the
	// installs of its current boot: the last one's state and installer
	// image. The read ends with ctx.
	InstallEvidence(ctx context.Context, node string) (talos.Evidence, error)
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
	// HandOver, when not nil, moves the runner to a successor pod before the
	// drain of Self before its reboot would evict it (see HandOver); nil: the
	// drain evicts SelfPod last.
	HandOver HandOver
	// PullOnly pre-pulls what the upgrade needs on the nodes that would take it, every
	// stage's images (a Talos upgrade's installers), and changes nothing: no check,
	// cordon, drain or apply. A path runs it for each of its hops before its first
	// change, so that an image missing anywhere on the path stops it with nothing done.
	PullOnly bool

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
	// StartingTimeout is how long after a node turned NotReady, its kubelet up, a
	// stage's checks wait for it to come Ready before they refuse it: a node back
	// from a boot (a resume right after a rollback or a repair) is NotReady until
	// its runtime and network are up (waitStarting).
	StartingTimeout time.Duration
	// StaticPodSettle is how long, after a control plane's kubelet moved to a new
	// version, its static pods must stay Ready before the next node, unless that
	// kubelet already restarted them (it may: see settleStaticPods).
	StaticPodSettle time.Duration
	// UnreachableGrace is how long a read of a node's Talos side that changes nothing
	// is tried again while its Talos API is unreachable (apid restarting, a link
	// flapping, a power cycle) before the operation pauses on it: a Kubernetes stage's
	// reads and dry run, a Talos upgrade's reads of what the node runs and of its boot
	// ID before its Upgrade call.
	UnreachableGrace time.Duration
	Concurrency      int // parallel Talos reads (the nodes' versions and configs)
	// PullConcurrency is how many nodes pre-pull at once (each pulls its
	// images together, under its own PullTimeout): a stage's component
	// images, and a Talos batch's installers before its first cordon.
	PullConcurrency int
}

// withDefaults fills every zero bound with its default.
func (o Options) withDefaults() Options {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}

	def(&o.ApplyTimeout, DefaultApplyTimeout)
	def(&o.VerifyTimeout, DefaultVerifyTimeout)
	def(&o.DrainTimeout, DefaultDrainTimeout)
	def(&o.UpgradeTimeout, DefaultUpgradeTimeout)
	def(&o.RebootTimeout, DefaultRebootTimeout)
	def(&o.PullTimeout, DefaultPullTimeout)
	def(&o.RenderTimeout, DefaultRenderTimeout)
	def(&o.RolloutStuckAfter, DefaultRolloutStuckAfter)
	def(&o.MirrorPodTimeout, DefaultMirrorPodTimeout)
	def(&o.StartingTimeout, DefaultStartingTimeout)
	def(&o.StaticPodSettle, DefaultStaticPodSettle)
	def(&o.UnreachableGrace, DefaultUnreachableGrace)

	if o.Concurrency <= 0 {
		o.Concurrency = DefaultConcurrency
	}

	if o.PullConcurrency <= 0 {
		o.PullConcurrency = DefaultPullConcurrency
	}

	if o.MaxUnavailable <= 0 {
		o.MaxUnavailable = 1
	}

	return o
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
	DefaultStartingTimeout  = kube.StartingWindow
	DefaultStaticPodSettle  = 30 * time.Second
	DefaultUnreachableGrace = 30 * time.Second
	DefaultConcurrency      = 32
	DefaultPullConcurrency  = 32
)

// DefaultRolloutStuckAfter is Options.RolloutStuckAfter's default: it outlasts a
// node's short NotReady (a kubelet restart).
const DefaultRolloutStuckAfter = time.Minute

// talosReadTimeout bounds one read of a node's Talos side (version, config,
// manifests); applies, pulls and waits have their own bounds in
// Options.
const talosReadTimeout = time.Minute

// Kind is the kind of an upgrade.
type Kind string

// The kinds of upgrade.
const (
	KindKubernetes Kind = "kubernetes"
	KindTalos      Kind = "talos"
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

// StepProgress may be implemented by a Progress to hear about a stage's own
// steps, which belong to no node (the KubeProxy stage's manifest sync and
// DaemonSet rollout). step is a short name ("manifests", "rollout"), message
// one line.
type StepProgress interface {
	Step(stage, step, message string)
}

// StepTimer may be implemented by a Progress to time a stage's own steps
// (the pre-pull, the bootstrap manifests' sync, the kube-proxy rollout), so
// that an estimate of the time left counts them: called when a step begins,
// as a rollout advances, and when the step is done, each time just before
// the StepProgress call that says it (an implementation may keep the timing
// for that call's write).
type StepTimer interface {
	StepTime(stage, step string, t StepTiming)
}

// StepTiming is how far a stage's own step has come.
type StepTiming struct {
	// Done is true once the step is done.
	Done bool
	// Pods, Updated and MaxUnavailable follow a DaemonSet's rollout: its
	// pods, those already updated, and how many it replaces at once (zero
	// for the other steps).
	Pods, Updated, MaxUnavailable int
}

// Steps of a stage that belong to no node, as StepProgress and StepTimer
// name them.
const (
	StepPrePull   = "pre-pull"
	StepManifests = "manifests"
	StepRollout   = "rollout"
)

// Memo is a small durable key/value store. Set returns only once the value
// is durable (written to the state ConfigMap), so a restarted runner sees it.
type Memo interface {
	Get(key string) (string, bool)
	Set(ctx context.Context, key, value string) error
}

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
