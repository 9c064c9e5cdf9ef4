package v1alpha1

import (
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// KindOperation is the kind of the Operation document.
const KindOperation = "Operation"

// Phase is where an operation is.
type Phase string

// The phases of an operation.
const (
	// PhasePending: launched or resumed, no runner has taken the lock yet.
	PhasePending Phase = "Pending"
	// PhaseRunning: a runner holds the lock and drives the engine.
	PhaseRunning Phase = "Running"
	// PhasePaused: a failure stopped the operation; `resume` continues it.
	PhasePaused Phase = "Paused"
	// PhaseSucceeded: every stage is done.
	PhaseSucceeded Phase = "Succeeded"
	// PhaseAborted: `abort` stopped it (or its launch failed); the state stays for the record.
	PhaseAborted Phase = "Aborted"
)

// Finished reports whether nothing will change the operation any more.
func (p Phase) Finished() bool { return p == PhaseSucceeded || p == PhaseAborted }

// Known reports whether p is one of the phases of an operation.
func (p Phase) Known() bool {
	switch p {
	case PhasePending, PhaseRunning, PhasePaused, PhaseSucceeded, PhaseAborted:
		return true
	}

	return false
}

// Operation is the state of one upgrade, as the state ConfigMap holds it and
// `kubectl ichor status -o json|yaml` prints it.
type Operation struct {
	// APIVersion is always APIVersion.
	APIVersion string `json:"apiVersion"`
	// Kind is always KindOperation.
	Kind string `json:"kind"`
	// Spec is what was asked; it does not change after the launch.
	Spec OperationSpec `json:"spec"`
	// Status is where the operation is.
	Status OperationStatus `json:"status"`
}

// OperationSpec is what the operator asked for.
type OperationSpec struct {
	// ID names the operation, e.g. kubernetes-v1-36-3-7kq2x.
	ID string `json:"id"`
	// Upgrade is UpgradeKubernetes, UpgradeTalos or UpgradeCluster (a path of hops).
	Upgrade string `json:"upgrade"`
	// Target is the version to reach, vX.Y.Z; for UpgradeCluster the targets asked
	// for, in words ("talos v1.14.1, kubernetes v1.37.2").
	Target string `json:"target"`
	// Hops are the path's upgrades, run in this order (UpgradeCluster only).
	Hops []HopSpec `json:"hops,omitempty"`
	// PauseBetweenHops pauses the operation after every hop but the last
	// (--pause-between-hops): `resume` goes on with the next.
	PauseBetweenHops bool `json:"pauseBetweenHops,omitempty"`
	// Installers are the operator's explicit Talos installers
	// (--installer-image, --drop-extensions); a node without one gets the
	// one chosen from what it runs.
	Installers Installers `json:"installers,omitzero"`
	// MaxUnavailable is how many workers move at once.
	MaxUnavailable int `json:"maxUnavailable"`
	// PullConcurrency is how many nodes pre-pull at once (0: the engine's default).
	PullConcurrency int `json:"pullConcurrency,omitempty"`
	// ManifestsForce lists the bootstrap manifest objects whose fields owned by another
	// field manager the sync takes over ("all" for every one).
	ManifestsForce []string `json:"manifestsForce,omitempty"`
	// AllowEtcdOutage accepts that a control plane's reboot stops a one- or
	// two-member etcd (a Talos upgrade: --allow-etcd-outage).
	AllowEtcdOutage bool `json:"allowEtcdOutage,omitempty"`
	// Image is the runner's image.
	Image string `json:"image"`
	// Credentials say where the runner's Talos credentials come from.
	Credentials Credentials `json:"talosCredentials"`
	// Timeouts bound the engine's waits; zero values take the engine's defaults.
	Timeouts Timeouts `json:"timeouts"`
	// CreatedAt is when the operation was launched.
	CreatedAt metav1.Time `json:"createdAt"`
	// CreatedBy says which plugin launched it ("kubectl-ichor <version>").
	CreatedBy string `json:"createdBy,omitempty"`
}

// HopSpec is one hop of a path as the operation runs it: an upgrade of one kind to
// one version.
type HopSpec struct {
	// Upgrade is UpgradeKubernetes or UpgradeTalos.
	Upgrade string `json:"upgrade"`
	// To is the version the hop goes to, vX.Y.Z.
	To string `json:"to"`
	// Source says where To came from (SourceTarget, SourceVia, SourceRegistry).
	Source string `json:"source,omitempty"`
	// Installers are the operator's explicit installers of a Talos hop, tagged with its
	// version (none: each node's is chosen from what it runs).
	Installers Installers `json:"installers,omitzero"`
}

// Label is the hop in words, "kubernetes v1.35.4".
func (h HopSpec) Label() string { return h.Upgrade + " " + h.To }

// Runs are the upgrades an operation runs, in order: its hops, or the one
// upgrade of a plain operation.
func (s OperationSpec) Runs() []HopSpec {
	if s.Upgrade == UpgradeCluster {
		return s.Hops
	}

	return []HopSpec{{Upgrade: s.Upgrade, To: s.Target, Source: SourceTarget, Installers: s.Installers}}
}

// Timeouts are the engine's bounds an operator may change with flags.
type Timeouts struct {
	Apply   *metav1.Duration `json:"apply,omitempty"`
	Verify  *metav1.Duration `json:"verify,omitempty"`
	Drain   *metav1.Duration `json:"drain,omitempty"`
	Upgrade *metav1.Duration `json:"upgrade,omitempty"`
	Reboot  *metav1.Duration `json:"reboot,omitempty"`
	// Pull bounds one node's pre-pull of a stage's images.
	Pull *metav1.Duration `json:"pull,omitempty"`
}

// Timeout is d as a time.Duration, 0 for none.
func Timeout(d *metav1.Duration) time.Duration {
	if d == nil {
		return 0
	}

	return d.Duration
}

// NewTimeout is t as a Timeouts field, nil for 0.
func NewTimeout(t time.Duration) *metav1.Duration {
	if t <= 0 {
		return nil
	}

	return &metav1.Duration{Duration: t}
}

// Installers are the operator's say in the installers of a Talos upgrade
// (--installer-image IMAGE for every node, NODE=IMAGE for one, and
// --drop-extensions NODE,...). Its fields are the engine's InstallerFlags.
type Installers struct {
	// Image is the installer of every node without its own ("": each
	// node's is chosen from what it runs).
	Image string `json:"image,omitempty"`
	// Nodes are installers of single nodes, by node name.
	Nodes map[string]string `json:"nodes,omitempty"`
	// DropExtensions are the nodes whose explicit installer may drop what
	// they run (their schematic, their system extensions).
	DropExtensions []string `json:"dropExtensions,omitempty"`
}

// Credentials say where the Job's Talos credentials come from.
type Credentials string

// The kinds of Talos credentials.
const (
	// CredentialsServiceAccount is a talos.dev/v1alpha1 ServiceAccount with role os:admin:
	// Talos writes its talosconfig into a Secret of the same name.
	CredentialsServiceAccount Credentials = "serviceaccount"
	// CredentialsLocal is a copy of the operator's talosconfig in a Secret, deleted when
	// the operation ends.
	CredentialsLocal Credentials = "local"
)

// OperationStatus is where an operation is.
type OperationStatus struct {
	// Phase is Pending, Running, Paused, Succeeded or Aborted.
	Phase Phase `json:"phase"`
	// Stage is the stage the engine is in (or stopped in).
	Stage string `json:"stage,omitempty"`
	// StageIndex numbers Stage from 1; StageCount is the number of stages.
	StageIndex int `json:"stageIndex,omitempty"`
	StageCount int `json:"stageCount,omitempty"`
	// Step is the stage's own step that belongs to no node (manifest sync, rollout).
	Step string `json:"step,omitempty"`
	// Manifests is what the last bootstrap manifest sync did: what it applied, and the
	// objects it left to another field manager. It stays when the next step or stage
	// begins, so a finished operation still says it.
	Manifests string `json:"manifests,omitempty"`
	// Reason says why the operation paused or was aborted; Action what to do about it.
	Reason string `json:"reason,omitempty"`
	Action string `json:"action,omitempty"`
	// PausedNode is the node the operation paused on, if any.
	PausedNode string `json:"pausedNode,omitempty"`
	// Job is the operation's current Job; Attempt counts its Jobs (1 at launch).
	Job     string `json:"job,omitempty"`
	Attempt int    `json:"attempt,omitempty"`
	// Runner is the pod that last held the lock.
	Runner string `json:"runner,omitempty"`
	// Runs counts the runner pods that took the lock for this operation.
	Runs int `json:"runs,omitempty"`
	// Hop is the number (from 1) of the path's hop under way, or of the last one done
	// while the path waits between hops (NextHop is the one to run next; UpgradeCluster
	// only).
	Hop int `json:"hop,omitempty"`
	// Hops record the path's hops started so far, in order: when each started and
	// was done. The stage, nodes and steps above are the current hop's.
	Hops []HopStatus `json:"hops,omitempty"`
	// Nodes is every node's last known step, in the order the engine first reported them.
	Nodes []NodeStatus `json:"nodes,omitempty"`
	// Pauses are where and why the operation paused, oldest first (the last
	// MaxPauses).
	Pauses []PauseRecord `json:"pauses,omitempty"`
	// Memo is the engine's small durable memory.
	Memo map[string]string `json:"memo,omitempty"`
	// Steps time the stages' own steps (pre-pull, manifest sync, kube-proxy
	// rollout), one record per stage and step: a resumed runner keeps them
	// for the estimate of the time left.
	Steps []StepRecord `json:"steps,omitempty"`
	// Runners are the runner pods that took the lock, oldest first (the last
	// MaxRunners): when each started and ended, and how long the operation
	// went without one before it.
	Runners []RunnerRecord `json:"runners,omitempty"`
	// LaunchedAt is when the operation was launched, to the microsecond (the
	// first runner's wait for its pod and the lock is measured from it).
	LaunchedAt *metav1.MicroTime `json:"launchedAt,omitempty"`
	// StartedAt is when a runner first took the lock; UpdatedAt the last write;
	// FinishedAt when the operation succeeded or was aborted.
	StartedAt  *metav1.Time `json:"startedAt,omitempty"`
	UpdatedAt  *metav1.Time `json:"updatedAt,omitempty"`
	FinishedAt *metav1.Time `json:"finishedAt,omitempty"`
}

// HopStatus is one hop of a path that started.
type HopStatus struct {
	// Number numbers the hop from 1; Upgrade and To are its spec's.
	Number  int    `json:"number"`
	Upgrade string `json:"upgrade"`
	To      string `json:"to"`
	// Started is when its first runner began it; Done when it was done.
	Started metav1.MicroTime  `json:"started"`
	Done    *metav1.MicroTime `json:"done,omitempty"`
	// Nodes counts the nodes it visited.
	Nodes int `json:"nodes,omitempty"`
}

// HopsDone are the hops done, in order.
func (s *OperationStatus) HopsDone() []HopStatus {
	var out []HopStatus

	for _, h := range s.Hops {
		if h.Done != nil {
			out = append(out, h)
		}
	}

	return out
}

// NextHop is the number of the hop a runner begins with: the one the status is in
// (the first when none), or the next when that one is done.
func (s *OperationStatus) NextHop() int {
	n := max(s.Hop, 1)
	if slices.ContainsFunc(s.Hops, func(h HopStatus) bool { return h.Number == n && h.Done != nil }) {
		return n + 1
	}

	return n
}

// StartHop records hop number (from 1) of spec as under way from now, once: a resumed
// runner keeps its first start. The stage, nodes and steps of the hop before are
// cleared (the hop records how many nodes it visited).
func (s *OperationStatus) StartHop(spec OperationSpec, number int, now time.Time) {
	s.Hop = number

	if slices.ContainsFunc(s.Hops, func(h HopStatus) bool { return h.Number == number }) {
		return
	}

	h := spec.Runs()[number-1]
	s.Hops = append(s.Hops, HopStatus{Number: number, Upgrade: h.Upgrade, To: h.To, Started: metav1.NewMicroTime(now.UTC())})
	s.Stage, s.StageIndex, s.StageCount, s.Step = "", 0, 0, ""
	s.Nodes, s.Steps = nil, nil
}

// EndHop records hop number as done at now, with the nodes it visited.
func (s *OperationStatus) EndHop(number int, now time.Time) {
	for i := range s.Hops {
		if h := &s.Hops[i]; h.Number == number && h.Done == nil {
			at := metav1.NewMicroTime(now.UTC())
			h.Done, h.Nodes = &at, len(s.Nodes)
		}
	}
}

// MaxPauses bounds OperationStatus.Pauses.
const MaxPauses = 20

// MaxRunners bounds OperationStatus.Runners.
const MaxRunners = 20

// StepRecord times one of a stage's own steps. A time is the first one seen,
// but Done, which is the last (the manifest sync is done once per control
// plane).
type StepRecord struct {
	// Stage and Step name it (the steps: pre-pull, manifests, rollout).
	Stage string `json:"stage"`
	Step  string `json:"step"`
	// Started is when it began; Done when it was last done.
	Started metav1.MicroTime  `json:"started"`
	Done    *metav1.MicroTime `json:"done,omitempty"`
	// Pods, Updated and MaxUnavailable follow a DaemonSet's rollout, as seen
	// at Observed: its pods, those updated, how many it replaces at once.
	Pods           int               `json:"pods,omitempty"`
	Updated        int               `json:"updated,omitempty"`
	MaxUnavailable int               `json:"maxUnavailable,omitempty"`
	Observed       *metav1.MicroTime `json:"observed,omitempty"`
}

// StepOf returns the record of a stage's step, nil when none.
func (s *OperationStatus) StepOf(stage, step string) *StepRecord {
	for i := range s.Steps {
		if s.Steps[i].Stage == stage && s.Steps[i].Step == step {
			return &s.Steps[i]
		}
	}

	return nil
}

// RunnerRecord is one runner pod that took the lock.
type RunnerRecord struct {
	// Pod and Node are the runner's pod and the node it ran on.
	Pod  string `json:"pod"`
	Node string `json:"node,omitempty"`
	// Idle is when the operation was left without a runner before this one:
	// the previous runner's end (its last write when it ended without one),
	// the launch for the first runner.
	Idle metav1.MicroTime `json:"idle"`
	// Started is when it took the lock; Ended when it stopped (evicted,
	// paused, succeeded), empty while it runs or when it died without a word.
	Started metav1.MicroTime  `json:"started"`
	Ended   *metav1.MicroTime `json:"ended,omitempty"`
	// AfterPause is true when the operation was paused before it started:
	// the time without a runner was the operator's.
	AfterPause bool `json:"afterPause,omitempty"`
	// StaysOnNode is true when its pod tolerates the cordon because no other
	// node could host it: its node's drain keeps it (JobParams.StayOnNode).
	StaysOnNode bool `json:"staysOnNode,omitempty"`
}

// StartRunner records a runner taking the lock at now; resumed says the
// operation was resumed after a pause since the last runner. The first
// runner waited from the launch (LaunchedAt, else createdAt).
func (s *OperationStatus) StartRunner(pod, node string, resumed bool, createdAt, now time.Time) {
	idle := createdAt
	if s.LaunchedAt != nil {
		idle = s.LaunchedAt.Time
	}

	switch {
	case len(s.Runners) > 0 && s.Runners[len(s.Runners)-1].Ended != nil:
		idle = s.Runners[len(s.Runners)-1].Ended.Time
	case len(s.Runners) > 0 && s.UpdatedAt != nil:
		idle = s.UpdatedAt.Time
	}

	s.Runners = append(s.Runners, RunnerRecord{
		Pod: pod, Node: node, Idle: metav1.NewMicroTime(idle.UTC()), Started: metav1.NewMicroTime(now.UTC()),
		AfterPause: resumed,
	})
	if len(s.Runners) > MaxRunners {
		s.Runners = s.Runners[len(s.Runners)-MaxRunners:]
	}
}

// EndRunner records the current runner's end at now.
func (s *OperationStatus) EndRunner(now time.Time) {
	if len(s.Runners) == 0 {
		return
	}

	at := metav1.NewMicroTime(now.UTC())
	s.Runners[len(s.Runners)-1].Ended = &at
}

// PauseRecord is one pause of an operation.
type PauseRecord struct {
	// At is when it paused.
	At metav1.Time `json:"at"`
	// Hop is the path's hop it paused in (UpgradeCluster only).
	Hop int `json:"hop,omitempty"`
	// Stage and Node are where (Node empty for a stage's own step).
	Stage string `json:"stage,omitempty"`
	Node  string `json:"node,omitempty"`
	// Reason is why.
	Reason string `json:"reason"`
}

// AddPause records a pause, keeping the last MaxPauses.
func (s *OperationStatus) AddPause(stage, node, reason string, now time.Time) {
	s.Pauses = append(s.Pauses, PauseRecord{At: metav1.NewTime(now.UTC().Truncate(time.Second)), Hop: s.Hop, Stage: stage, Node: node, Reason: reason})
	if len(s.Pauses) > MaxPauses {
		s.Pauses = s.Pauses[len(s.Pauses)-MaxPauses:]
	}
}

// NodeStatus is one node's last known step.
type NodeStatus struct {
	// Name is the Node's name.
	Name string `json:"name"`
	// Stage is the stage this step belongs to.
	Stage string `json:"stage"`
	// Phase is the node's phase in that stage, as the engine names it: Pending,
	// Cordoned, Draining, Applying, Upgrading, Verifying, Done, Failed or Held.
	Phase string `json:"phase"`
	// Message is one line: what was done or what is awaited.
	Message string `json:"message,omitempty"`
	// Since is when the node entered this phase.
	Since metav1.Time `json:"since"`
	// Timeline says, for every stage that visited the node, when its apply began and
	// when it was done, to the microsecond: how long each node took, and how long the
	// upgrade waited between nodes.
	Timeline []NodeStageTimes `json:"timeline,omitempty"`
}

// NodeStageTimes is when one stage changed and verified a node. A time is the first
// one seen: a runner that takes over and verifies the node again keeps it.
type NodeStageTimes struct {
	// Stage is the stage.
	Stage string `json:"stage"`
	// ApplyStarted is when the node's apply began (its dry run; in a Talos
	// upgrade its Upgrade call); empty when the stage only verified the node.
	ApplyStarted *metav1.MicroTime `json:"applyStarted,omitempty"`
	// Done is when the node was done: verified (and, in the Kubelets stage,
	// uncordoned).
	Done *metav1.MicroTime `json:"done,omitempty"`
}

// Node returns the named node's status, nil when none was recorded.
func (s *OperationStatus) Node(name string) *NodeStatus {
	for i := range s.Nodes {
		if s.Nodes[i].Name == name {
			return &s.Nodes[i]
		}
	}

	return nil
}

// Age is how long ago the operation was launched.
func (o *Operation) Age(now time.Time) time.Duration {
	return now.Sub(o.Spec.CreatedAt.Time).Truncate(time.Second)
}

// NewOperation returns a Pending operation.
func NewOperation(spec OperationSpec) *Operation {
	return &Operation{APIVersion: APIVersion, Kind: KindOperation, Spec: spec, Status: OperationStatus{Phase: PhasePending}}
}
