package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
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

// TalosClient is the Talos API the Engine uses: one interface per upgrade
// kind, composed. *talos.Client satisfies it.
type TalosClient interface {
	KubernetesTalos
	OSTalos
}

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

	if err != nil {
		return err
	}

	return e.reportHeldCordoned(ctx, last)
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
	def(&o.StaticPodSettle, DefaultStaticPodSettle)

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

// stage reports the start of a stage.
func (e *Engine) stage(index, total int, name string) {
	e.line("Stage %d/%d %s", index, total, name)

	if e.Progress != nil {
		e.Progress.Stage(index, total, name)
	}
}

// node reports a node's phase.
func (e *Engine) node(stage, node string, phase NodePhase, format string, args ...any) {
	msg := oneLine(fmt.Sprintf(format, args...))
	e.line("  %s %s: %s", node, phase, msg)

	if e.Progress != nil {
		e.Progress.Node(stage, node, phase, msg)
	}
}

// step reports a stage-wide step.
func (e *Engine) step(stage, step, format string, args ...any) {
	msg := oneLine(fmt.Sprintf(format, args...))
	e.line("  [%s] %s", step, msg)

	if sp, ok := e.Progress.(StepProgress); ok {
		sp.Step(stage, step, msg)
	}
}

// stepTime reports how far a stage-wide step has come.
func (e *Engine) stepTime(stage, step string, t StepTiming) {
	if st, ok := e.Progress.(StepTimer); ok {
		st.StepTime(stage, step, t)
	}
}

func (e *Engine) line(format string, args ...any) {
	if e.Out == nil {
		return
	}

	e.outMu.Lock()
	defer e.outMu.Unlock()

	_, _ = fmt.Fprintf(e.Out, format+"\n", args...)
}

// oneLine folds a message onto one line.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// pause reports a failed node (when node is set) and returns the
// *PauseError; when ctx ended, it returns ctx's error instead, wrapped, for
// the runner to tell a stop from a failure.
func (e *Engine) pause(ctx context.Context, stage, node, reason, action string, err error) error {
	if ctx.Err() != nil {
		if node != "" {
			return fmt.Errorf("stage %s: node %q: %w", stage, node, ctx.Err())
		}

		return fmt.Errorf("stage %s: %w", stage, ctx.Err())
	}

	reason = oneLine(reason)

	if node != "" {
		e.node(stage, node, PhaseFailed, "%s", reason)
	} else if stage != "" {
		e.step(stage, "failed", "%s", reason)
	}

	return &PauseError{Stage: stage, Node: node, Reason: reason, Action: action, Err: err}
}

// cordonAndDrain makes sure the node is cordoned (see ensureCordoned) and
// drains it; a node found schedulable again once drained (uncordoned during
// the drain) is cordoned and drained again, a bounded number of times. A
// failed drain uncordons it again. It returns a summary ("drained 3 pods").
func (e *Engine) cordonAndDrain(ctx context.Context, opts Options, stage, name string) (string, error) {
	evicted := 0

	for round := 1; ; round++ {
		if err := e.ensureCordoned(ctx, stage, name); err != nil {
			return "", err
		}

		n, err := e.drain(ctx, opts, stage, name)
		if err != nil {
			return "", err
		}

		evicted += n

		state, err := kube.ReadCordon(ctx, e.Kube, name)
		if err != nil {
			return "", e.pause(ctx, stage, name, err.Error(), actionResume, err)
		}

		if state == kube.CordonedByUs {
			return fmt.Sprintf("drained %d pod(s)", evicted), nil
		}

		if round == maxCordonRounds {
			err := fmt.Errorf("node %q was made schedulable again during each of %d drains", name, round)

			return "", e.pause(ctx, stage, name, err.Error()+"; it is not rebooted while pods can land on it",
				"find who uncordons it (kubectl get events --field-selector involvedObject.name="+name+"), stop them, then resume", err)
		}

		e.node(stage, name, PhaseCordoned, "made schedulable during its drain: cordoning and draining it again")
	}
}

// maxCordonRounds bounds cordonAndDrain's rounds.
const maxCordonRounds = 3

// ensureCordoned cordons the node unless it is cordoned and carries ichor's
// mark, reading it from the API server: a node with the mark but schedulable
// (someone followed a pause message and ran kubectl uncordon) is cordoned
// again before any drain or reboot.
func (e *Engine) ensureCordoned(ctx context.Context, stage, name string) error {
	state, err := kube.ReadCordon(ctx, e.Kube, name)
	if err != nil {
		return e.pause(ctx, stage, name, err.Error(), actionResume, err)
	}

	switch state {
	case kube.CordonedByUs:
		return nil
	case kube.MarkedButSchedulable:
		if err := kube.Recordon(ctx, e.Kube, name); err != nil {
			return e.pause(ctx, stage, name, err.Error(), actionResume, err)
		}

		e.node(stage, name, PhaseCordoned, "cordoned again: it carried %s but was schedulable (uncordoned by hand)", kube.CordonedAnnotation)
	default:
		if err := kube.Cordon(ctx, e.Kube, name, time.Now()); err != nil {
			return e.pause(ctx, stage, name, err.Error(), actionResume, err)
		}

		e.node(stage, name, PhaseCordoned, "cordoned (%s)", kube.CordonedAnnotation)
	}

	return nil
}

// drain drains the cordoned node and returns how many pods it evicted. A
// failed drain uncordons it again.
func (e *Engine) drain(ctx context.Context, opts Options, stage, name string) (int, error) {
	e.node(stage, name, PhaseDraining, "draining (bound %s)", opts.DrainTimeout)

	last, keep := opts.SelfPod, ""
	if opts.StayOnNode {
		last, keep = "", opts.SelfPod
	}

	evicted, err := kube.Drainer{
		Client:          e.Kube,
		Timeout:         opts.DrainTimeout,
		EvictRetryDelay: e.evictRetryDelay,
		Last:            last,
		Keep:            keep,
		OnEvicted: func(pod string) {
			e.node(stage, name, PhaseDraining, "evicted %s", pod)
		},
	}.Drain(ctx, name)
	if err != nil {
		// Cancelled (the runner itself evicted, or stopped): the node stays
		// cordoned by ichor, and the next run finishes it first.
		if ctx.Err() != nil {
			return 0, fmt.Errorf("stage %s: node %q: drain: %w", stage, name, ctx.Err())
		}

		if uerr := kube.Uncordon(ctx, e.Kube, name); uerr != nil {
			err = errors.Join(err, uerr)
		}

		return 0, e.pause(ctx, stage, name, err.Error()+" (uncordoned again)",
			"make the pods evictable (kubectl get pdb -A; a pod with no controller must be moved by hand), or hold the node, then resume", err)
	}

	return evicted, nil
}
