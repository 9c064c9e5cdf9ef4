package job

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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

	if err := writeOperation(cm, op, nil); err != nil {
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

// writeOperation stores op in cm, gzipped with z (nil: a compressor of its own), with
// the labels that mirror it.
func writeOperation(cm *corev1.ConfigMap, op *api.Operation, z *zipper) error {
	b, err := json.Marshal(op)
	if err != nil {
		return fmt.Errorf("encode operation %s: %w", op.Spec.ID, err)
	}

	blob, err := z.gzip(b)
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
	case op.Spec.Upgrade != api.UpgradeKubernetes && op.Spec.Upgrade != api.UpgradeTalos && op.Spec.Upgrade != api.UpgradeCluster:
		return nil, corrupt("%s: unknown spec.upgrade %q", key, op.Spec.Upgrade)
	case op.Spec.Upgrade == api.UpgradeCluster && len(op.Spec.Hops) == 0:
		return nil, corrupt("%s: spec.upgrade %s has no spec.hops", key, api.UpgradeCluster)
	case op.Status.Hop < 0 || op.Status.Hop > len(op.Spec.Runs()):
		return nil, corrupt("%s: status.hop %d is not a hop of the %d in spec.hops", key, op.Status.Hop, len(op.Spec.Runs()))
	}

	for i, h := range op.Spec.Hops {
		if h.Upgrade != api.UpgradeKubernetes && h.Upgrade != api.UpgradeTalos {
			return nil, corrupt("%s: spec.hops[%d]: unknown upgrade %q", key, i, h.Upgrade)
		}
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

// maxUnzipped bounds what a gzipped value of the state or the history may
// unpack to (a corrupted or hostile value must not exhaust the memory).
const maxUnzipped = 64 << 20

// gzipJSON returns v as gzipped JSON.
func gzipJSON(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}

	return gzipBytes(b)
}

// gzipBytes returns b gzipped.
func gzipBytes(b []byte) ([]byte, error) {
	var buf bytes.Buffer

	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(b); err != nil {
		return nil, err
	}

	if err := zw.Close(); err != nil {
		return nil, err
	}

	return buf.Bytes(), nil
}

// zipper gzips with one compressor, reset for each use: setting one up allocates some
// 800 KiB, and a runner writes its state at every step of every node. It is safe for
// concurrent use; the nil zipper sets up a compressor for each use.
type zipper struct {
	mu  sync.Mutex
	w   *gzip.Writer
	buf bytes.Buffer
}

// gzip returns b gzipped, the same bytes as gzipBytes(b).
func (z *zipper) gzip(b []byte) ([]byte, error) {
	if z == nil {
		return gzipBytes(b)
	}

	z.mu.Lock()
	defer z.mu.Unlock()

	z.buf.Reset()

	if z.w == nil {
		z.w = gzip.NewWriter(&z.buf)
	} else {
		z.w.Reset(&z.buf)
	}

	if _, err := z.w.Write(b); err != nil {
		return nil, err
	}

	if err := z.w.Close(); err != nil {
		return nil, err
	}

	return bytes.Clone(z.buf.Bytes()), nil
}

// gunzip returns what blob holds, at most maxUnzipped bytes.
func gunzip(blob []byte) ([]byte, error) {
	zr, err := gzip.NewReader(bytes.NewReader(blob))
	if err != nil {
		return nil, err
	}

	raw, err := io.ReadAll(io.LimitReader(zr, maxUnzipped+1))
	if err != nil {
		return nil, err
	}

	if len(raw) > maxUnzipped {
		return nil, fmt.Errorf("unpacks to more than %d MiB", maxUnzipped>>20)
	}

	return raw, nil
}
