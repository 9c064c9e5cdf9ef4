package kube

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	appslisters "k8s.io/client-go/listers/apps/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
)

// DefaultSyncTimeout bounds the first LIST of every informer of a Cache.
const DefaultSyncTimeout = 2 * time.Minute

// DefaultHeartbeat is how often Cache.Wait reports what it still waits for
// when nothing changed.
const DefaultHeartbeat = 15 * time.Second

// Condition is what a Cache waits for. It reads the cache and returns done,
// or what it still waits for, in one line ("kube-apiserver-cp-1 on v1.36.3
// not Ready").
type Condition func() (done bool, waiting string)

// WaitTimeoutError is returned by Wait when its bound passes first.
type WaitTimeoutError struct {
	// After is the bound that passed.
	After time.Duration
	// Waiting is what the condition still waited for, last time it was
	// evaluated.
	Waiting string
}

// Error implements error.
func (e *WaitTimeoutError) Error() string {
	return fmt.Sprintf("not done after %s: %s", e.After, e.Waiting)
}

// Cache watches what verification reads: every Node (through the runner's
// Nodes), the pods in kube-system with a k8s-app label of a control-plane
// component or kube-proxy, and the DaemonSets in kube-system. Start it with
// StartCache; it is safe for concurrent use.
type Cache struct {
	nodes      corelisters.NodeLister
	pods       corelisters.PodLister
	daemonSets appslisters.DaemonSetLister
	cancel     context.CancelFunc
	// heartbeat is how often Wait reports what it waits for even when that
	// did not change, so a status line's "waited" stays fresh.
	heartbeat time.Duration

	mu      sync.Mutex
	waiters map[int]chan struct{}
	next    int
}

// CacheComponents are the k8s-app labels of the pods a Cache holds.
func CacheComponents() []string {
	return []string{
		string(discovery.APIServer), string(discovery.ControllerManager), string(discovery.Scheduler),
		string(discovery.KubeProxy),
	}
}

// StartCache starts the informers of the pods and DaemonSets, takes the Nodes
// from nodes (the runner's watch, shared), and returns once each has listed
// once, or an error when that takes longer than DefaultSyncTimeout (the
// apiserver is unreachable, or RBAC forbids the reads). Stop it with Stop,
// which leaves nodes running.
func StartCache(ctx context.Context, client kubernetes.Interface, nodes *Nodes) (*Cache, error) {
	ctx, cancel := context.WithCancel(ctx)
	c := &Cache{nodes: nodes.lister, heartbeat: DefaultHeartbeat, waiters: map[int]chan struct{}{}}

	system := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(discovery.StaticPodNamespace))
	systemPods := informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithNamespace(discovery.StaticPodNamespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.LabelSelector = fmt.Sprintf("%s in (%s)", discovery.ComponentLabel, strings.Join(CacheComponents(), ","))
		}))

	pods := systemPods.Core().V1().Pods()
	daemonSets := system.Apps().V1().DaemonSets()
	c.pods, c.daemonSets = pods.Lister(), daemonSets.Lister()

	handler := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { c.notify() },
		UpdateFunc: func(any, any) { c.notify() },
		DeleteFunc: func(any) { c.notify() },
	}

	nodesSynced, removeNodes, err := nodes.onChange(handler)
	if err != nil {
		cancel()

		return nil, fmt.Errorf("watch the cluster: %w", err)
	}

	c.cancel = func() { cancel(); removeNodes() }
	synced := []cache.InformerSynced{nodesSynced}

	for _, inf := range []cache.SharedIndexInformer{pods.Informer(), daemonSets.Informer()} {
		reg, err := inf.AddEventHandler(handler)
		if err != nil {
			c.cancel()

			return nil, fmt.Errorf("watch the cluster: %w", err)
		}

		synced = append(synced, inf.HasSynced, reg.HasSynced)
	}

	for _, f := range []informers.SharedInformerFactory{system, systemPods} {
		f.Start(ctx.Done())
	}

	if err := waitSynced(ctx, synced...); err != nil {
		c.cancel()

		if err := ctx.Err(); err != nil {
			return nil, err
		}

		return nil, fmt.Errorf("watch the cluster: nodes, pods and daemonsets in %s not listed within %s: check the "+
			"apiserver is reachable and that the credentials may list and watch them", discovery.StaticPodNamespace, DefaultSyncTimeout)
	}

	return c, nil
}

// Stop stops the informers of the pods and DaemonSets, and the Cache's
// following of the Nodes' watch (which goes on).
func (c *Cache) Stop() { c.cancel() }

// WakeAfter makes every Wait look at its condition again after d, whether the cache saw
// a change or not: for a condition that depends on how long something lasted.
func (c *Cache) WakeAfter(d time.Duration) { time.AfterFunc(d, c.notify) }

func (c *Cache) notify() {
	c.mu.Lock()
	defer c.mu.Unlock()

	for _, ch := range c.waiters {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// Changes returns a channel that receives (coalesced) when the cache sees a change, and
// the function that stops it: for a wait that also keeps time of its own.
func (c *Cache) Changes() (<-chan struct{}, func()) { return c.subscribe() }

func (c *Cache) subscribe() (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)

	c.mu.Lock()
	id := c.next
	c.next++
	c.waiters[id] = ch
	c.mu.Unlock()

	return ch, func() {
		c.mu.Lock()
		delete(c.waiters, id)
		c.mu.Unlock()
	}
}

// Wait evaluates cond now and again on every change the cache sees, until it
// is done (nil), ctx ends (ctx's error) or timeout passes (a
// *WaitTimeoutError with what cond still waited for). report, when not nil,
// is called whenever what cond waits for changes, and every heartbeat while
// it does not.
func (c *Cache) Wait(ctx context.Context, timeout time.Duration, cond Condition, report func(waiting string)) error {
	changed, cancel := c.subscribe()
	defer cancel()

	timer := time.NewTimer(timeout)
	defer timer.Stop()

	heartbeat := time.NewTicker(c.heartbeat)
	defer heartbeat.Stop()

	last := ""

	for {
		done, waiting := cond()
		if done {
			return nil
		}

		if waiting != last {
			last = waiting
			if report != nil {
				report(waiting)
			}
		}

		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-timer.C:
			// One last look: the change may have landed with the deadline.
			if done, waiting = cond(); done {
				return nil
			}

			return &WaitTimeoutError{After: timeout, Waiting: waiting}
		case <-heartbeat.C:
			if report != nil {
				report(last)
			}
		case <-changed:
		}
	}
}

// Node returns the Node named name as last seen.
func (c *Cache) Node(name string) (*corev1.Node, bool) {
	n, err := c.nodes.Get(name)
	if err != nil {
		return nil, false
	}

	return n, true
}

// MirrorPods returns the pods of component (k8s-app label) bound to node, not
// being deleted, by name.
func (c *Cache) MirrorPods(node string, component discovery.Component) []*corev1.Pod {
	sel := labels.SelectorFromSet(labels.Set{discovery.ComponentLabel: string(component)})

	pods, err := c.pods.Pods(discovery.StaticPodNamespace).List(sel)
	if err != nil {
		return nil
	}

	var out []*corev1.Pod

	for _, p := range pods {
		if p.Spec.NodeName == node && p.DeletionTimestamp == nil {
			out = append(out, p)
		}
	}

	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })

	return out
}

// DaemonSet returns the DaemonSet in kube-system named name.
func (c *Cache) DaemonSet(name string) (*appsv1.DaemonSet, bool) {
	ds, err := c.daemonSets.DaemonSets(discovery.StaticPodNamespace).Get(name)
	if err != nil {
		return nil, false
	}

	return ds, true
}
