package job

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/ichor-dev/kubectl-ichor/pkg/engine"
	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
)

// Document identity of the Operation.
const (
	// APIVersion is the Operation's apiVersion.
	APIVersion = "ichor.dev/v1alpha1"
	// KindOperation is the Operation's kind.
	KindOperation = "Operation"
)

// Keys of the state ConfigMap's binaryData. Both are gzipped: a 5000-node
// upgrade's state takes about 112 KiB so, where its JSON would pass the 1 MiB
// a ConfigMap may hold at about 1600 nodes (TestStateAtFiveThousandNodes).
const (
	// OperationKey holds the Operation document (gzipped JSON).
	OperationKey = "operation.json.gz"
	// PlanKey holds the plan the operator confirmed (the Plan document, gzipped JSON).
	PlanKey = "plan.json.gz"
	// OperationJSONKey, under data, holds the Operation as plain JSON: a state
	// written by hand or by a GitOps tool (manifests/) gives it so. It is read
	// before OperationKey, and the first write of the state replaces it with
	// OperationKey.
	OperationJSONKey = "operation.json"
)

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

func (p Phase) known() bool {
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
	// Upgrade is "kubernetes" or "talos".
	Upgrade engine.Kind `json:"upgrade"`
	// Target is the version to reach, vX.Y.Z.
	Target string `json:"target"`
	// Installers are the operator's explicit Talos installers
	// (--installer-image, --drop-extensions); a node without one gets the
	// one chosen from what it runs.
	Installers stages.InstallerFlags `json:"installers,omitzero"`
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
	// Nodes is every node's last known step, in the order the engine first reported them.
	Nodes []NodeStatus `json:"nodes,omitempty"`
	// Pauses are where and why the operation paused, oldest first (the last
	// MaxPauses).
	Pauses []PauseRecord `json:"pauses,omitempty"`
	// Memo is the engine's small durable memory (engine.Memo).
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

// MaxPauses bounds OperationStatus.Pauses.
const MaxPauses = 20

// MaxRunners bounds OperationStatus.Runners.
const MaxRunners = 20

// StepRecord times one of a stage's own steps. A time is the first one seen,
// but Done, which is the last (the manifest sync is done once per control
// plane).
type StepRecord struct {
	// Stage and Step name it (engine.StepPrePull, StepManifests, StepRollout).
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

// SetStep records how far a stage's step has come.
func (s *OperationStatus) SetStep(stage, step string, t engine.StepTiming, now time.Time) {
	at := metav1.NewMicroTime(now.UTC())

	r := s.StepOf(stage, step)
	if r == nil {
		s.Steps = append(s.Steps, StepRecord{Stage: stage, Step: step, Started: at})
		r = &s.Steps[len(s.Steps)-1]
	}

	if t.Pods > 0 {
		r.Pods, r.Updated, r.MaxUnavailable, r.Observed = t.Pods, t.Updated, t.MaxUnavailable, &at
	}

	if t.Done {
		r.Done = &at
	}
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
	// Stage and Node are where (Node empty for a stage's own step).
	Stage string `json:"stage,omitempty"`
	Node  string `json:"node,omitempty"`
	// Reason is why.
	Reason string `json:"reason"`
}

// AddPause records a pause, keeping the last MaxPauses.
func (s *OperationStatus) AddPause(stage, node, reason string, now time.Time) {
	s.Pauses = append(s.Pauses, PauseRecord{At: metav1.NewTime(now.UTC().Truncate(time.Second)), Stage: stage, Node: node, Reason: reason})
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
	// Phase is the node's phase in that stage.
	Phase engine.NodePhase `json:"phase"`
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
	// ApplyStarted is when the node's apply began (its dry run); empty when the
	// stage only verified the node.
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

// SetNode records a node's step (a change of phase or message).
func (s *OperationStatus) SetNode(stage, name string, phase engine.NodePhase, message string, now time.Time) {
	n := s.Node(name)
	if n == nil {
		s.Nodes = append(s.Nodes, NodeStatus{Name: name})
		n = &s.Nodes[len(s.Nodes)-1]
	}

	if n.Stage != stage || n.Phase != phase || n.Since.IsZero() {
		n.Since = metav1.NewTime(now.UTC().Truncate(time.Second))
	}

	n.Stage, n.Phase, n.Message = stage, phase, message

	if phase != engine.PhaseApplying && phase != engine.PhaseDone {
		return
	}

	i := slices.IndexFunc(n.Timeline, func(t NodeStageTimes) bool { return t.Stage == stage })
	if i < 0 {
		n.Timeline = append(n.Timeline, NodeStageTimes{Stage: stage})
		i = len(n.Timeline) - 1
	}

	at := metav1.NewMicroTime(now.UTC())

	switch t := &n.Timeline[i]; {
	case phase == engine.PhaseApplying && t.ApplyStarted == nil:
		t.ApplyStarted = &at
	case phase == engine.PhaseDone && t.Done == nil:
		t.Done = &at
	}
}

// Age is how long ago the operation was launched.
func (o *Operation) Age(now time.Time) time.Duration {
	return now.Sub(o.Spec.CreatedAt.Time).Truncate(time.Second)
}

// NewOperation returns a Pending operation.
func NewOperation(spec OperationSpec) *Operation {
	return &Operation{APIVersion: APIVersion, Kind: KindOperation, Spec: spec, Status: OperationStatus{Phase: PhasePending}}
}

// CorruptStateError is a state ConfigMap that cannot be read as an Operation.
type CorruptStateError struct {
	Namespace string
	Err       error
}

// Error implements error, on one line, saying what to do.
func (e *CorruptStateError) Error() string {
	return fmt.Sprintf("state configmap %s/%s is corrupted (%v): stop any upgrade Job with kubectl ichor abort -n %s, "+
		"then delete the configmap (kubectl delete configmap -n %s %s) to start over",
		e.Namespace, StateName, e.Err, e.Namespace, e.Namespace, StateName)
}

// Unwrap returns the cause.
func (e *CorruptStateError) Unwrap() error { return e.Err }

// ErrNoOperation means the namespace holds no operation.
var ErrNoOperation = errors.New("no operation")

// NoOperationError says that no operation was found and what to do.
func NoOperationError(namespace string) error {
	return fmt.Errorf("%w in namespace %s: start one with kubectl ichor upgrade, or pass -n with the namespace it runs in", ErrNoOperation, namespace)
}

// EncodeState returns the state ConfigMap holding op and the confirmed plan (JSON; nil
// for none), both gzipped.
func EncodeState(namespace string, op *Operation, plan []byte) (*corev1.ConfigMap, error) {
	cm := &corev1.ConfigMap{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Name: StateName, Namespace: namespace},
	}

	if plan != nil {
		blob, err := gzipBytes(plan)
		if err != nil {
			return nil, fmt.Errorf("encode the plan of operation %s: %w", op.Spec.ID, err)
		}

		cm.BinaryData = map[string][]byte{PlanKey: blob}
	}

	if err := writeOperation(cm, op); err != nil {
		return nil, err
	}

	return cm, nil
}

// encodeStateJSON returns the state ConfigMap of op as one writes it by hand or
// with a GitOps tool: the Operation as indented JSON under OperationJSONKey, no
// plan.
func encodeStateJSON(namespace string, op *Operation) (*corev1.ConfigMap, error) {
	cm, err := EncodeState(namespace, op, nil)
	if err != nil {
		return nil, err
	}

	b, err := json.MarshalIndent(op, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode operation %s: %w", op.Spec.ID, err)
	}

	cm.BinaryData = nil
	cm.Data = map[string]string{OperationJSONKey: string(b) + "\n"}

	return cm, nil
}

// writeOperation stores op in cm, gzipped, with the labels that mirror it.
func writeOperation(cm *corev1.ConfigMap, op *Operation) error {
	blob, err := gzipJSON(op)
	if err != nil {
		return fmt.Errorf("encode operation %s: %w", op.Spec.ID, err)
	}

	if cm.BinaryData == nil {
		cm.BinaryData = map[string][]byte{}
	}

	cm.BinaryData[OperationKey] = blob
	delete(cm.Data, OperationJSONKey)

	labels := commonLabels(map[string]string{LabelOperation: op.Spec.ID, LabelPhase: string(op.Status.Phase)})
	if cm.Labels == nil {
		cm.Labels = map[string]string{}
	}

	for k, v := range labels {
		cm.Labels[k] = v
	}

	return nil
}

// DecodeState reads the Operation of a state ConfigMap. Anything it cannot make sense of
// is a *CorruptStateError.
func DecodeState(cm *corev1.ConfigMap) (*Operation, error) {
	corrupt := func(format string, args ...any) error {
		return &CorruptStateError{Namespace: cm.Namespace, Err: fmt.Errorf(format, args...)}
	}

	key := OperationJSONKey
	raw := []byte(cm.Data[OperationJSONKey])

	if _, plain := cm.Data[OperationJSONKey]; !plain {
		key = OperationKey

		blob, found := cm.BinaryData[OperationKey]
		if !found {
			return nil, corrupt("no key %s", OperationKey)
		}

		var err error
		if raw, err = gunzip(blob); err != nil {
			return nil, corrupt("%s: %v", key, err)
		}
	}

	var op Operation

	if err := json.Unmarshal(raw, &op); err != nil {
		return nil, corrupt("%s: %v", key, err)
	}

	switch {
	case op.APIVersion != APIVersion || op.Kind != KindOperation:
		return nil, corrupt("%s is a %s %s, want %s %s", key, op.APIVersion, op.Kind, APIVersion, KindOperation)
	case op.Spec.ID == "":
		return nil, corrupt("%s has no spec.id", key)
	case !op.Status.Phase.known():
		return nil, corrupt("%s: unknown status.phase %q", key, op.Status.Phase)
	case op.Spec.Upgrade != engine.KindKubernetes && op.Spec.Upgrade != engine.KindTalos:
		return nil, corrupt("%s: unknown spec.upgrade %q", key, op.Spec.Upgrade)
	}

	return &op, nil
}

// StatePlan returns the confirmed plan's JSON a state ConfigMap holds, nil when it
// holds none. A plan it cannot unpack, or that is not JSON, is a *CorruptStateError.
func StatePlan(cm *corev1.ConfigMap) ([]byte, error) {
	blob, found := cm.BinaryData[PlanKey]
	if !found {
		return nil, nil
	}

	raw, err := gunzip(blob)
	if err == nil && !json.Valid(raw) {
		err = errors.New("not JSON")
	}

	if err != nil {
		return nil, &CorruptStateError{Namespace: cm.Namespace, Err: fmt.Errorf("%s: %w", PlanKey, err)}
	}

	return raw, nil
}

// Store reads and writes the state ConfigMap of one namespace. Writes are
// optimistic: an update carries the resourceVersion it read, and a conflict
// re-reads and re-applies the change.
type Store struct {
	// Client reaches the ConfigMaps.
	Client corev1client.ConfigMapsGetter
	// Namespace is the product's namespace.
	Namespace string
	// Now is the clock (tests set it); nil means time.Now.
	Now func() time.Time

	mu   sync.Mutex
	last *corev1.ConfigMap // the ConfigMap as this Store last read or wrote it
}

// remember keeps cm as the latest known state.
func (s *Store) remember(cm *corev1.ConfigMap) {
	s.mu.Lock()
	defer s.mu.Unlock()

	s.last = cm.DeepCopy()
}

// cached is a copy of the latest known state, nil when none.
func (s *Store) cached() *corev1.ConfigMap {
	s.mu.Lock()
	defer s.mu.Unlock()

	if s.last == nil {
		return nil
	}

	return s.last.DeepCopy()
}

// maxConflicts bounds the re-reads of one Update.
const maxConflicts = 20

func (s *Store) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}

	return time.Now()
}

// Get returns the operation and the ConfigMap it was read from. No ConfigMap is
// ErrNoOperation (wrapped); a corrupted one a *CorruptStateError.
func (s *Store) Get(ctx context.Context) (*Operation, *corev1.ConfigMap, error) {
	cm, err := s.Client.ConfigMaps(s.Namespace).Get(ctx, StateName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil, NoOperationError(s.Namespace)
	}

	if err != nil {
		return nil, nil, fmt.Errorf("read %s: %w", describe("configmap", s.Namespace, StateName), err)
	}

	op, err := DecodeState(cm)
	if err != nil {
		return nil, cm, err
	}

	s.remember(cm)

	return op, cm, nil
}

// Create writes a new operation with its plan. When the namespace already holds one,
// replace is called with it: it returns an error to refuse (the operation is still in
// progress), nil to replace it. The replacement is conditional on the resourceVersion
// read, so of two concurrent launches one wins and the other sees the winner.
func (s *Store) Create(ctx context.Context, op *Operation, plan []byte, replace func(old *Operation) error) error {
	cms := s.Client.ConfigMaps(s.Namespace)

	for range maxConflicts {
		cm, err := EncodeState(s.Namespace, op, plan)
		if err != nil {
			return err
		}

		_, err = cms.Create(ctx, cm, metav1.CreateOptions{FieldManager: FieldManager})
		if err == nil {
			return nil
		}

		if !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create %s: %w", describe("configmap", s.Namespace, StateName), err)
		}

		old, existing, err := s.Get(ctx)
		if errors.Is(err, ErrNoOperation) {
			continue // deleted in between: create again
		}

		if err != nil {
			return err
		}

		if err := replace(old); err != nil {
			return err
		}

		plan, err := StatePlan(existing)
		if err != nil {
			return err
		}

		// The ended operation goes to the history before its state is replaced.
		if err := s.Archive(ctx, Record{Operation: old, Plan: plan}); err != nil {
			return fmt.Errorf("keep operation %s in the history before replacing it: %w", old.Spec.ID, err)
		}

		cm.ResourceVersion = existing.ResourceVersion

		_, err = cms.Update(ctx, cm, metav1.UpdateOptions{FieldManager: FieldManager})
		if err == nil {
			return nil
		}

		if !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
			return fmt.Errorf("replace %s: %w", describe("configmap", s.Namespace, StateName), err)
		}
	}

	return fmt.Errorf("write %s: too many concurrent writers, try again", describe("configmap", s.Namespace, StateName))
}

// Update reads the operation, lets mutate change it and writes it back on the condition
// that nobody wrote in between; on a conflict it starts over with a fresh read. An error
// of mutate is returned as is and nothing is written. The first attempt starts from what
// this Store last read or wrote (a writer that keeps its Store saves a read per write).
func (s *Store) Update(ctx context.Context, mutate func(op *Operation) error) (*Operation, error) {
	cms := s.Client.ConfigMaps(s.Namespace)
	cm := s.cached()

	for range maxConflicts {
		var (
			op  *Operation
			err error
		)

		if cm != nil {
			op, err = DecodeState(cm)
		}

		if cm == nil || err != nil {
			if op, cm, err = s.Get(ctx); err != nil {
				return nil, err
			}
		}

		if err := mutate(op); err != nil {
			return nil, err
		}

		op.Status.UpdatedAt = ptrTime(s.now())

		if err := writeOperation(cm, op); err != nil {
			return nil, err
		}

		updated, err := cms.Update(ctx, cm, metav1.UpdateOptions{FieldManager: FieldManager})
		if err == nil {
			if updated != nil && updated.ResourceVersion != "" {
				s.remember(updated)
			}

			return op, nil
		}

		if !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("write %s: %w", describe("configmap", s.Namespace, StateName), err)
		}

		cm = nil // someone wrote meanwhile: read again
	}

	return nil, fmt.Errorf("write %s: %d conflicts in a row, too many concurrent writers", describe("configmap", s.Namespace, StateName), maxConflicts)
}

// Plan returns the confirmed plan's JSON, nil when the state holds none; a plan
// that cannot be read is a *CorruptStateError (StatePlan).
func (s *Store) Plan(ctx context.Context) ([]byte, error) {
	_, cm, err := s.Get(ctx)
	if err != nil {
		return nil, err
	}

	return StatePlan(cm)
}

func ptrTime(t time.Time) *metav1.Time {
	mt := metav1.NewTime(t.UTC().Truncate(time.Second))

	return &mt
}
