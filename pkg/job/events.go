package job

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/ichor-dev/kubectl-ichor/pkg/kube"
)

// eventQueue bounds the events waiting to be written; more are dropped (and logged).
const eventQueue = 256

// eventRecorder records a Kubernetes Event for each step of the runner: about the Node
// for a node's step (in namespace default, where Node events go, so that `kubectl
// describe node` shows them), about the state ConfigMap for the operation's. Events are
// written by one goroutine so that a slow API does not hold the engine; losing one is
// logged, never fatal.
type eventRecorder struct {
	kube kubernetes.Interface
	// nodes, when not nil, gives a Node's UID without a request.
	nodes     *kube.Nodes
	namespace string
	instance  string
	host      string
	logf      func(format string, args ...any)

	queue chan *corev1.Event
	done  chan struct{}

	mu     sync.Mutex
	uids   map[string]types.UID
	closed bool
}

func newEventRecorder(client kubernetes.Interface, nodes *kube.Nodes, namespace, instance, host string, logf func(string, ...any)) *eventRecorder {
	e := &eventRecorder{
		kube: client, nodes: nodes, namespace: namespace, instance: instance, host: host, logf: logf,
		queue: make(chan *corev1.Event, eventQueue),
		done:  make(chan struct{}),
		uids:  map[string]types.UID{},
	}

	go e.loop()

	return e
}

// node records an event about a node. Like operation, it returns at once: the event,
// and the lookup of the object's UID, are written by the recorder's goroutine.
func (e *eventRecorder) node(_ context.Context, node, reason, message string, warning bool) {
	ref := corev1.ObjectReference{APIVersion: "v1", Kind: "Node", Name: node}
	e.record(metav1.NamespaceDefault, ref, reason, message, warning)
}

// operation records an event about the operation (its state ConfigMap).
func (e *eventRecorder) operation(_ context.Context, reason, message string, warning bool) {
	ref := corev1.ObjectReference{APIVersion: "v1", Kind: "ConfigMap", Namespace: e.namespace, Name: StateName}
	e.record(e.namespace, ref, reason, message, warning)
}

// uid looks an object's UID up once (events without it do not show in kubectl describe):
// a Node's in the runner's watch of the Nodes when it has it, any age (a Node's UID
// changes only when it registers anew).
func (e *eventRecorder) uid(ctx context.Context, kind, name string) types.UID {
	key := kind + "/" + name

	e.mu.Lock()
	uid, found := e.uids[key]
	e.mu.Unlock()

	if found {
		return uid
	}

	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()

	var meta *metav1.ObjectMeta

	switch kind {
	case "node":
		if n, ok := e.cachedNode(name); ok {
			meta = &n.ObjectMeta
		} else if n, err := e.kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{}); err == nil {
			meta = &n.ObjectMeta
		}
	default:
		if cm, err := e.kube.CoreV1().ConfigMaps(e.namespace).Get(ctx, name, metav1.GetOptions{}); err == nil {
			meta = &cm.ObjectMeta
		}
	}

	if meta == nil {
		return ""
	}

	e.mu.Lock()
	e.uids[key] = meta.UID
	e.mu.Unlock()

	return meta.UID
}

func (e *eventRecorder) cachedNode(name string) (*corev1.Node, bool) {
	if e.nodes == nil {
		return nil, false
	}

	return e.nodes.Cached(name)
}

func (e *eventRecorder) record(namespace string, ref corev1.ObjectReference, reason, message string, warning bool) {
	now := metav1.NewTime(time.Now())
	kind := corev1.EventTypeNormal

	if warning {
		kind = corev1.EventTypeWarning
	}

	ev := &corev1.Event{
		ObjectMeta:          metav1.ObjectMeta{Name: fmt.Sprintf("%s.%x", ref.Name, now.UnixNano()), Namespace: namespace},
		InvolvedObject:      ref,
		Reason:              reason,
		Message:             message,
		Type:                kind,
		Source:              corev1.EventSource{Component: AppName, Host: e.host},
		FirstTimestamp:      now,
		LastTimestamp:       now,
		Count:               1,
		ReportingController: "ichor.dev/runner",
		ReportingInstance:   e.instance,
	}

	e.mu.Lock()
	defer e.mu.Unlock()

	if e.closed {
		return
	}

	select {
	case e.queue <- ev:
	default:
		e.logf("event dropped (too many queued): %s %s: %s", ref.Name, reason, message)
	}
}

func (e *eventRecorder) loop() {
	defer close(e.done)

	for ev := range e.queue {
		kind := "node"
		if ev.InvolvedObject.Kind == "ConfigMap" {
			kind = "configmap"
		}

		ev.InvolvedObject.UID = e.uid(context.Background(), kind, ev.InvolvedObject.Name)

		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := e.kube.CoreV1().Events(ev.Namespace).Create(ctx, ev, metav1.CreateOptions{})

		cancel()

		if err != nil {
			e.logf("event %s %s not recorded: %v", ev.InvolvedObject.Name, ev.Reason, err)
		}
	}
}

// close writes the queued events (for a few seconds at most) and stops.
func (e *eventRecorder) close() {
	e.mu.Lock()
	e.closed = true
	close(e.queue)
	e.mu.Unlock()

	select {
	case <-e.done:
	case <-time.After(5 * time.Second):
	}
}
