package job

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
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
func EncodeState(namespace string, op *api.Operation, plan []byte) (*corev1.ConfigMap, error) {
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
func encodeStateJSON(namespace string, op *api.Operation) (*corev1.ConfigMap, error) {
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
func writeOperation(cm *corev1.ConfigMap, op *api.Operation) error {
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
func DecodeState(cm *corev1.ConfigMap) (*api.Operation, error) {
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

	var op api.Operation

	if err := json.Unmarshal(raw, &op); err != nil {
		return nil, corrupt("%s: %v", key, err)
	}

	switch {
	case op.APIVersion != api.APIVersion || op.Kind != api.KindOperation:
		return nil, corrupt("%s is a %s %s, want %s %s", key, op.APIVersion, op.Kind, api.APIVersion, api.KindOperation)
	case op.Spec.ID == "":
		return nil, corrupt("%s has no spec.id", key)
	case !op.Status.Phase.Known():
		return nil, corrupt("%s: unknown status.phase %q", key, op.Status.Phase)
	case op.Spec.Upgrade != api.UpgradeKubernetes && op.Spec.Upgrade != api.UpgradeTalos:
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
func (s *Store) Get(ctx context.Context) (*api.Operation, *corev1.ConfigMap, error) {
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
func (s *Store) Create(ctx context.Context, op *api.Operation, plan []byte, replace func(old *api.Operation) error) error {
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
func (s *Store) Update(ctx context.Context, mutate func(op *api.Operation) error) (*api.Operation, error) {
	cms := s.Client.ConfigMaps(s.Namespace)
	cm := s.cached()

	for range maxConflicts {
		var (
			op  *api.Operation
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
