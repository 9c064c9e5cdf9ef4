package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/kubectl/pkg/drain"
)

// CordonedAnnotation marks a Node that ichor cordoned; its value is when.
// A resumed engine finishes such a node first and uncordons it; abort
// uncordons every node that has it.
const CordonedAnnotation = "ichor.dev/cordoned"

// DefaultEvictRetryDelay is how long a drain waits before evicting a pod
// again when a PodDisruptionBudget refused it (kubectl drain's own default).
const DefaultEvictRetryDelay = 5 * time.Second

// CordonedByIchor reports whether n carries CordonedAnnotation.
func CordonedByIchor(n *corev1.Node) bool {
	_, ok := n.Annotations[CordonedAnnotation]

	return ok
}

// Cordon marks the node unschedulable and sets CordonedAnnotation to now, in
// one patch. A node the user had cordoned is marked too: the upgrade
// uncordons every node it drains (the plan says so).
func Cordon(ctx context.Context, client kubernetes.Interface, node string, now time.Time) error {
	_, err := patchNode(ctx, client, node, "", true, now.UTC().Format(time.RFC3339))

	return err
}

// Uncordon marks the node schedulable and removes CordonedAnnotation, in one
// patch.
func Uncordon(ctx context.Context, client kubernetes.Interface, node string) error {
	_, err := uncordon(ctx, client, node)

	return err
}

func uncordon(ctx context.Context, client kubernetes.Interface, node string) (*corev1.Node, error) {
	return patchNode(ctx, client, node, "", false, "")
}

// patchNode patches the node's cordon and returns it as the patch left it. With
// resourceVersion, the patch is made only to the Node at that version (the API
// server answers a conflict otherwise).
func patchNode(ctx context.Context, client kubernetes.Interface, node, resourceVersion string, unschedulable bool, mark string) (*corev1.Node, error) {
	var annotation any // JSON null removes it
	if mark != "" {
		annotation = mark
	}

	meta := map[string]any{"annotations": map[string]any{CordonedAnnotation: annotation}}
	if resourceVersion != "" {
		meta["resourceVersion"] = resourceVersion
	}

	patch, err := json.Marshal(map[string]any{
		"metadata": meta,
		"spec":     map[string]any{"unschedulable": unschedulable},
	})
	if err != nil {
		return nil, err
	}

	op := "cordon"
	if !unschedulable {
		op = "uncordon"
	}

	var patched *corev1.Node

	err = Retry(ctx, 0, func(ctx context.Context) error {
		var err error

		patched, err = client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{})

		return err
	})
	if err != nil {
		return nil, fmt.Errorf("node %q: %s: %w", node, op, err)
	}

	return patched, nil
}

// Drainer evicts the pods of a node the way `kubectl drain
// --ignore-daemonsets --delete-emptydir-data` does: DaemonSet and mirror pods
// stay, every other pod is evicted (so PodDisruptionBudgets are respected,
// a refused eviction retried), and the drain waits until they are gone. A
// pod with no controller is not deleted: the drain fails naming it.
//
// It waits with a watch on the node's pods, so it ends the moment the last
// pod is gone (kubectl's drain helper looks every second).
type Drainer struct {
	// Client is the Kubernetes client.
	Client kubernetes.Interface
	// Timeout bounds the whole drain (required).
	Timeout time.Duration
	// EvictRetryDelay is the wait before retrying an eviction a budget
	// refused; 0 means DefaultEvictRetryDelay.
	EvictRetryDelay time.Duration
	// OnEvicted, when not nil, is called for every pod gone ("ns/name").
	OnEvicted func(pod string)
	// Last, "namespace/name", is a pod evicted only once every other pod of
	// the node is gone: the runner's own pod. Its eviction stops the runner,
	// and an eviction of another pod still in flight then could be cut short
	// after the API server counted it against the pod's budget but before it
	// deleted the pod: the budget would count that pod as disrupted for two
	// minutes (the disruption controller's DeletionTimeout) and refuse the
	// next runner's evictions meanwhile.
	Last string
	// Keep, "namespace/name", is a pod never evicted: the runner's own pod
	// when no other node can host it (it tolerates the cordon, so a
	// replacement would come back to this node). The drain ends once every
	// other pod is gone.
	Keep string
	// BeforeLast, when not nil, is called once only Last is left, before its
	// eviction: true means Last leaves by itself (the runner handed its work
	// to a successor and stops: see engine.HandOver), so it is not evicted and
	// the drain waits for it to go, or for ctx to end.
	BeforeLast func(ctx context.Context) bool
	// Accepted, when not nil, is called once every eviction of the drain was
	// accepted (or its pod found gone, or Last leaving by itself): from then on
	// each pod is being deleted under its grace period, and the drain only
	// waits for them to be gone. It is called at most once, not at all for a
	// drain that fails before, nor for one with nothing to evict.
	Accepted func()
}

// Drain drains node and returns how many pods it evicted. Its error says
// which pods could not be evicted and, for a budget, the last refusal.
func (d Drainer) Drain(ctx context.Context, node string) (int, error) {
	parent := ctx

	ctx, cancel := context.WithTimeoutCause(ctx, d.Timeout, errDrainTimeout)
	defer cancel()

	h := drainRules(ctx, d.Client)

	list, errs := h.GetPodsForDeletion(node)
	if len(errs) > 0 {
		return 0, fmt.Errorf("node %q: drain: %s", node, joinErrors(errs))
	}

	pods := slices.DeleteFunc(list.Pods(), func(p corev1.Pod) bool {
		return d.Keep != "" && p.Namespace+"/"+p.Name == d.Keep
	})
	if len(pods) == 0 {
		return 0, nil
	}

	// Watch from before the first eviction, so that no deletion is missed.
	w, err := d.watchPods(ctx, node, newPodSet(pods))
	if err != nil {
		return 0, d.failed(parent, ctx, node, err)
	}
	defer w.stop()

	evictCtx, stopEvicting := context.WithCancelCause(ctx)
	defer stopEvicting(nil)

	var (
		last     lastLines
		accepted atomic.Int32
	)

	// took counts one pod's eviction accepted, and says Accepted at the last.
	took := func() {
		if evictCtx.Err() == nil && int(accepted.Add(1)) == len(pods) && d.Accepted != nil {
			d.Accepted()
		}
	}

	for _, p := range pods {
		go func() {
			if p.Namespace+"/"+p.Name == d.Last {
				select {
				case <-evictCtx.Done():
					return
				case <-w.set.onlyLeft(d.Last):
				}

				if d.BeforeLast != nil && d.BeforeLast(evictCtx) {
					took()

					return
				}
			}

			if err := d.evict(evictCtx, h, p, &last); err != nil {
				stopEvicting(err)

				return
			}

			took()
		}()
	}

	err = w.wait(evictCtx, d.OnEvicted)
	evicted := w.gone()

	switch {
	case err == nil:
		return evicted, nil
	case context.Cause(evictCtx) != nil && !errors.Is(context.Cause(evictCtx), errDrainTimeout) && parent.Err() == nil:
		return evicted, fmt.Errorf("node %q: drain: %w", node, context.Cause(evictCtx))
	case parent.Err() == nil && errors.Is(context.Cause(ctx), errDrainTimeout):
		pod := w.first()
		msg := fmt.Sprintf("error when evicting pods/%q -n %q: global timeout reached: %s", pod.Name, pod.Namespace, d.Timeout)

		if l := last.last(); l != "" {
			msg += " (last: " + l + ")"
		}

		return evicted, fmt.Errorf("node %q: drain: %s", node, msg)
	}

	return evicted, d.failed(parent, ctx, node, err)
}

var errDrainTimeout = errors.New("drain timeout")

// Left is how many pods Drain would evict from node now that still run (Keep
// aside): none on a node drained since, unless a pod came (one that tolerates
// the cordon, or bound to the node by name) or stayed (the runner's own, a
// runner that handed over and has not ended yet). A pod that ended (Succeeded,
// Failed) runs nothing a reboot could cut, and is not counted. stopping is how
// many of them are being deleted already (evicted, their grace period
// running). Timeout bounds its list as it bounds a drain. Its error is the
// drain's: a pod the drain could not evict either (one with no controller) is
// named there.
func (d Drainer) Left(ctx context.Context, node string) (left, stopping int, err error) {
	parent := ctx

	ctx, cancel := context.WithTimeoutCause(ctx, d.Timeout, errDrainTimeout)
	defer cancel()

	list, errs := drainRules(ctx, d.Client).GetPodsForDeletion(node)
	if len(errs) > 0 {
		return 0, 0, d.failed(parent, ctx, node, errors.New(joinErrors(errs)))
	}

	for _, p := range list.Pods() {
		ended := p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
		if ended || (d.Keep != "" && p.Namespace+"/"+p.Name == d.Keep) {
			continue
		}

		left++

		if p.DeletionTimestamp != nil {
			stopping++
		}
	}

	return left, stopping, nil
}

// drainRules is kubectl's drain helper as every drain of ichor's runs it,
// and as PreviewDrain judges pods: `kubectl drain --ignore-daemonsets
// --delete-emptydir-data`, each pod's own grace period.
func drainRules(ctx context.Context, client kubernetes.Interface) *drain.Helper {
	return &drain.Helper{
		Ctx:                 ctx,
		Client:              client,
		GracePeriodSeconds:  -1,
		IgnoreAllDaemonSets: true,
		DeleteEmptyDirData:  true,
		Out:                 io.Discard,
		ErrOut:              io.Discard,
	}
}

func (d Drainer) failed(parent, ctx context.Context, node string, err error) error {
	if parent.Err() != nil {
		return fmt.Errorf("node %q: drain: %w", node, parent.Err())
	}

	if errors.Is(context.Cause(ctx), errDrainTimeout) {
		return fmt.Errorf("node %q: drain: global timeout reached: %s", node, d.Timeout)
	}

	return fmt.Errorf("node %q: drain: %w", node, err)
}

// evict evicts pod, again after EvictRetryDelay while a budget refuses, until
// it is accepted (or the pod is gone) or ctx ends.
func (d Drainer) evict(ctx context.Context, h *drain.Helper, pod corev1.Pod, last *lastLines) error {
	retry := d.EvictRetryDelay
	if retry <= 0 {
		retry = DefaultEvictRetryDelay
	}

	for {
		err := h.EvictPod(pod, policyv1.SchemeGroupVersion)

		switch {
		case err == nil, apierrors.IsNotFound(err):
			return nil
		case ctx.Err() != nil:
			return nil
		case apierrors.IsTooManyRequests(err):
			last.set(fmt.Sprintf("error when evicting pods/%q -n %q (will retry after %s): %v", pod.Name, pod.Namespace, retry, err))
		default:
			return fmt.Errorf("error when evicting pods/%q -n %q: %w", pod.Name, pod.Namespace, err)
		}

		select {
		case <-ctx.Done():
			return nil
		case <-time.After(retry):
		}
	}
}

// podSet is the pods a drain waits for, by namespace/name, with their UIDs
// (a pod of the same name and another UID is a new one: the old is gone).
type podSet struct {
	mu      sync.Mutex
	waiting map[string]corev1.Pod
	order   []string
	evicted int
	// unreported are pods gone before the evictions began to be followed.
	unreported []string
	// alone is closed once only the pod of aloneKey is left.
	alone    chan struct{}
	aloneKey string
}

// onlyLeft returns a channel closed once key is the only pod left.
func (s *podSet) onlyLeft(key string) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()

	if s.alone == nil {
		s.alone, s.aloneKey = make(chan struct{}), key
		s.checkAlone()
	}

	return s.alone
}

// checkAlone closes alone when only aloneKey is left; s.mu is held.
func (s *podSet) checkAlone() {
	if s.alone == nil || s.aloneKey == "" {
		return
	}

	if _, waiting := s.waiting[s.aloneKey]; len(s.waiting) <= 1 && (waiting || len(s.waiting) == 0) {
		close(s.alone)
		s.aloneKey = ""
	}
}

func newPodSet(pods []corev1.Pod) *podSet {
	s := &podSet{waiting: map[string]corev1.Pod{}}

	for _, p := range pods {
		key := p.Namespace + "/" + p.Name
		s.waiting[key] = p
		s.order = append(s.order, key)
	}

	return s
}

// gone marks the pods of keys gone when they were waited for, and returns those.
func (s *podSet) gone(keys ...string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()

	var out []string

	for _, key := range keys {
		if _, ok := s.waiting[key]; ok {
			delete(s.waiting, key)
			s.evicted++
			out = append(out, key)
		}
	}

	s.checkAlone()

	return out
}

func (s *podSet) done() bool {
	s.mu.Lock()
	defer s.mu.Unlock()

	return len(s.waiting) == 0
}

// podWatch follows the pods of one node until every pod of a podSet is gone.
type podWatch struct {
	d    Drainer
	node string
	set  *podSet
	w    watch.Interface
}

func (d Drainer) watchPods(ctx context.Context, node string, set *podSet) (*podWatch, error) {
	pw := &podWatch{d: d, node: node, set: set}

	gone, err := pw.relist(ctx)
	set.unreported = gone

	return pw, err
}

// relist lists the node's pods, marks those gone, and watches from there.
// It returns the pods it found gone.
func (pw *podWatch) relist(ctx context.Context) ([]string, error) {
	pw.stop()

	opts := metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.nodeName", pw.node).String()}

	list, err := pw.d.Client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, opts)
	if err != nil {
		return nil, err
	}

	present := map[string]types.UID{}
	for _, p := range list.Items {
		present[p.Namespace+"/"+p.Name] = p.UID
	}

	var gone []string

	pw.set.mu.Lock()
	for key, p := range pw.set.waiting {
		if uid, ok := present[key]; !ok || uid != p.UID {
			gone = append(gone, key)
		}
	}
	pw.set.mu.Unlock()

	opts.ResourceVersion = list.ResourceVersion

	pw.w, err = pw.d.Client.CoreV1().Pods(metav1.NamespaceAll).Watch(ctx, opts)

	return pw.set.gone(gone...), err
}

func (pw *podWatch) stop() {
	if pw.w != nil {
		pw.w.Stop()
		pw.w = nil
	}
}

// wait returns once every pod is gone, or with ctx's error.
func (pw *podWatch) wait(ctx context.Context, onGone func(string)) error {
	report := func(keys []string) {
		if onGone != nil {
			for _, key := range keys {
				onGone(key)
			}
		}
	}

	report(pw.set.unreported)

	for !pw.set.done() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case ev, ok := <-pw.w.ResultChan():
			if !ok || ev.Type == watch.Error {
				gone, err := pw.relist(ctx)
				report(gone)

				if err != nil {
					return err
				}

				continue
			}

			p, isPod := ev.Object.(*corev1.Pod)
			if !isPod {
				continue
			}

			key := p.Namespace + "/" + p.Name

			pw.set.mu.Lock()
			want, ok := pw.set.waiting[key]
			pw.set.mu.Unlock()

			if ok && (ev.Type == watch.Deleted || p.UID != want.UID) {
				report(pw.set.gone(key))
			}
		}
	}

	return nil
}

func (pw *podWatch) gone() int {
	pw.set.mu.Lock()
	defer pw.set.mu.Unlock()

	return pw.set.evicted
}

// first is the first pod still waited for.
func (pw *podWatch) first() corev1.Pod {
	pw.set.mu.Lock()
	defer pw.set.mu.Unlock()

	for _, key := range pw.set.order {
		if p, ok := pw.set.waiting[key]; ok {
			return p
		}
	}

	return corev1.Pod{}
}

func joinErrors(errs []error) string {
	msgs := make([]string, 0, len(errs))
	for _, err := range errs {
		msgs = append(msgs, strings.TrimSpace(err.Error()))
	}

	return strings.Join(msgs, "; ")
}

// lastLines keeps the last refusal of an eviction, so that an error that
// says only "global timeout reached" can say why.
type lastLines struct {
	mu   sync.Mutex
	line string
}

func (l *lastLines) set(line string) {
	l.mu.Lock()
	defer l.mu.Unlock()

	l.line = line
}

func (l *lastLines) last() string {
	l.mu.Lock()
	defer l.mu.Unlock()

	return l.line
}
