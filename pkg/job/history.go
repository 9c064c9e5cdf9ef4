package job

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
)

// The history of a namespace's ended operations: the ConfigMap HistoryName
// holds the last HistoryKeep of them, each under its ID as the gzipped JSON
// of a Record, oldest dropped first, and fewer when their sizes would pass
// HistoryBudget (a ConfigMap holds at most 1 MiB).
const (
	// HistoryName is the history ConfigMap's name.
	HistoryName = "ichor-history"
	// HistoryKeep is how many ended operations the history keeps.
	HistoryKeep = 5
	// HistoryBudget bounds the history's records, compressed, in bytes.
	HistoryBudget = 768 << 10
	// historyOrder is the annotation listing the records' IDs, oldest first.
	historyOrder = "ichor.dev/history-order"
)

// Record is one ended operation as the history keeps it: the Operation
// (every node's steps with their times, the pauses) and the plan it was
// confirmed with (what each stage changed on each node).
type Record struct {
	// Operation is the operation's last state.
	Operation *api.Operation `json:"operation"`
	// Plan is the Plan document it ran, as the state held it.
	Plan json.RawMessage `json:"plan,omitempty"`
}

// ErrNotInHistory means no operation of that ID is in the namespace's state
// or history.
var ErrNotInHistory = errors.New("no such operation")

// Archive adds rec to the history, dropping the oldest records past
// HistoryKeep or HistoryBudget. A record of the same ID is replaced.
func (s *Store) Archive(ctx context.Context, rec Record) error {
	blob, err := encodeRecord(rec)
	if err != nil {
		return err
	}

	if len(blob) > HistoryBudget {
		return fmt.Errorf("archive operation %s: its record is %d bytes compressed, over the history's %d", rec.Operation.Spec.ID, len(blob), HistoryBudget)
	}

	cms := s.Client.ConfigMaps(s.Namespace)

	for range maxConflicts {
		cm, err := cms.Get(ctx, HistoryName, metav1.GetOptions{})
		exists := err == nil

		switch {
		case apierrors.IsNotFound(err):
			cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: HistoryName, Namespace: s.Namespace, Labels: commonLabels(nil)}}
		case err != nil:
			return fmt.Errorf("read %s: %w", describe("configmap", s.Namespace, HistoryName), err)
		}

		addRecord(cm, rec.Operation.Spec.ID, blob)

		if !exists {
			_, err = cms.Create(ctx, cm, metav1.CreateOptions{FieldManager: FieldManager})
		} else {
			_, err = cms.Update(ctx, cm, metav1.UpdateOptions{FieldManager: FieldManager})
		}

		switch {
		case err == nil:
			return nil
		case apierrors.IsConflict(err), apierrors.IsAlreadyExists(err):
			continue
		default:
			return fmt.Errorf("write %s: %w", describe("configmap", s.Namespace, HistoryName), err)
		}
	}

	return fmt.Errorf("write %s: %d conflicts in a row, too many concurrent writers", describe("configmap", s.Namespace, HistoryName), maxConflicts)
}

// addRecord puts blob under id, newest last, and trims the oldest.
func addRecord(cm *corev1.ConfigMap, id string, blob []byte) {
	order := historyIDs(cm)
	order = slices.DeleteFunc(order, func(o string) bool { return o == id })
	order = append(order, id)

	if cm.BinaryData == nil {
		cm.BinaryData = map[string][]byte{}
	}

	cm.BinaryData[id] = blob

	size := func() int {
		n := 0
		for _, o := range order {
			n += len(cm.BinaryData[o])
		}

		return n
	}

	for len(order) > HistoryKeep || (len(order) > 1 && size() > HistoryBudget) {
		delete(cm.BinaryData, order[0])
		order = order[1:]
	}

	for key := range cm.BinaryData {
		if !slices.Contains(order, key) {
			delete(cm.BinaryData, key)
		}
	}

	b, _ := json.Marshal(order)

	if cm.Annotations == nil {
		cm.Annotations = map[string]string{}
	}

	cm.Annotations[historyOrder] = string(b)
}

// historyIDs are the IDs the history holds, oldest first.
func historyIDs(cm *corev1.ConfigMap) []string {
	var order []string
	if raw := cm.Annotations[historyOrder]; raw != "" {
		_ = json.Unmarshal([]byte(raw), &order)
	}

	return slices.DeleteFunc(order, func(id string) bool { return cm.BinaryData[id] == nil })
}

// History returns the records of the namespace's history, newest first;
// none when it has no history. A record that cannot be read is left out.
func (s *Store) History(ctx context.Context) ([]Record, error) {
	cm, err := s.Client.ConfigMaps(s.Namespace).Get(ctx, HistoryName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}

	if err != nil {
		return nil, fmt.Errorf("read %s: %w", describe("configmap", s.Namespace, HistoryName), err)
	}

	ids := historyIDs(cm)
	out := make([]Record, 0, len(ids))

	for _, id := range slices.Backward(ids) {
		if rec, err := decodeRecord(cm.BinaryData[id]); err == nil {
			out = append(out, rec)
		}
	}

	return out, nil
}

// Find returns the operation of that ID: the current one when it is, else
// from the history; an error wrapping ErrNotInHistory names what is there.
func (s *Store) Find(ctx context.Context, id string) (Record, error) {
	op, cm, err := s.Get(ctx)

	switch {
	case err == nil && op.Spec.ID == id:
		plan, err := StatePlan(cm)
		if err != nil {
			return Record{}, err
		}

		return Record{Operation: op, Plan: plan}, nil
	case err != nil && !errors.Is(err, ErrNoOperation):
		return Record{}, err
	}

	history, err := s.History(ctx)
	if err != nil {
		return Record{}, err
	}

	var known []string
	if op != nil {
		known = append(known, op.Spec.ID)
	}

	for _, rec := range history {
		if rec.Operation.Spec.ID == id {
			return rec, nil
		}

		known = append(known, rec.Operation.Spec.ID)
	}

	if len(known) == 0 {
		return Record{}, fmt.Errorf("%w %s in namespace %s: it holds none; pass -n with the namespace it ran in", ErrNotInHistory, id, s.Namespace)
	}

	return Record{}, fmt.Errorf("%w %s in namespace %s: it knows %v (the last %d ended are kept)", ErrNotInHistory, id, s.Namespace, known, HistoryKeep)
}

func encodeRecord(rec Record) ([]byte, error) {
	blob, err := gzipJSON(rec)
	if err != nil {
		return nil, fmt.Errorf("encode the record of operation %s: %w", rec.Operation.Spec.ID, err)
	}

	return blob, nil
}

func decodeRecord(blob []byte) (Record, error) {
	raw, err := gunzip(blob)
	if err != nil {
		return Record{}, err
	}

	var rec Record
	if err := json.Unmarshal(raw, &rec); err != nil {
		return Record{}, err
	}

	if rec.Operation == nil {
		return Record{}, errors.New("no operation")
	}

	return rec, nil
}
