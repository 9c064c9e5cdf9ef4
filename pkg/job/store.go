package job

import (
	"context"
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

// ErrNoOperation means the namespace holds no operation.
var ErrNoOperation = errors.New("no operation")

// NoOperationError says that no operation was found and what to do.
func NoOperationError(namespace string) error {
	return fmt.Errorf("%w in namespace %s: start one with kubectl ichor upgrade, or pass -n with the namespace it runs in", ErrNoOperation, namespace)
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
	zip  zipper            // gzips the Operation of every write
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

		if err := writeOperation(cm, op, &s.zip); err != nil {
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
