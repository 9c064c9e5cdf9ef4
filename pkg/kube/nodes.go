package kube

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/resourceversion"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
)

// DefaultCatchUp bounds how long Nodes.Get waits for its watch to show what the
// runner last wrote to (or read fresh of) a Node before it asks the API server
// instead: a watch event lands within milliseconds, but an apiserver that
// restarts cuts the watch for longer.
const DefaultCatchUp = 2 * time.Second

// Nodes is a watch cache of every Node, started once by the upgrade's runner and
// shared by all it runs: each engine Run's Cache (verification), its reads of
// a Node, its events. A read from it costs no request.
//
// It never answers older than what the runner itself did: it keeps the
// resourceVersion of each Node the runner wrote (its cordons) or read from the
// API server, and Get answers from the watch only once it shows that
// version or a newer one, else, after DefaultCatchUp, from the API server.
// What must be fresh whoever changed it (whether someone uncordoned a node a
// moment ago) is read with ReadCordon, from the API server. It is safe for
// concurrent use; the Nodes it returns are the cache's, not to be modified.
type Nodes struct {
	client   kubernetes.Interface
	informer cache.SharedIndexInformer
	lister   corelisters.NodeLister
	cancel   context.CancelFunc
	catchUp  time.Duration

	mu sync.Mutex
	// seen is the resourceVersion of each Node as the runner last wrote it or
	// read it from the API server.
	seen map[string]string
	// changed is closed, and replaced, at every change the watch sees.
	changed chan struct{}
}

// StartNodes starts the watch of every Node and returns once it has listed
// them, or an error when that takes longer than DefaultSyncTimeout (the
// apiserver is unreachable, or RBAC forbids the reads). Stop it with Stop.
func StartNodes(ctx context.Context, client kubernetes.Interface) (*Nodes, error) {
	ctx, cancel := context.WithCancel(ctx)

	factory := informers.NewSharedInformerFactory(client, 0)
	inf := factory.Core().V1().Nodes()
	n := &Nodes{
		client: client, informer: inf.Informer(), lister: inf.Lister(), cancel: cancel, catchUp: DefaultCatchUp,
		seen: map[string]string{}, changed: make(chan struct{}),
	}

	reg, err := n.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { n.notify() },
		UpdateFunc: func(any, any) { n.notify() },
		DeleteFunc: func(any) { n.notify() },
	})
	if err != nil {
		cancel()

		return nil, fmt.Errorf("watch the nodes: %w", err)
	}

	factory.Start(ctx.Done())

	if err := waitSynced(ctx, n.informer.HasSynced, reg.HasSynced); err != nil {
		cancel()

		if ctx.Err() != nil {
			return nil, ctx.Err()
		}

		return nil, fmt.Errorf("watch the nodes: not listed within %s: check the apiserver is reachable and that the "+
			"credentials may list and watch nodes", DefaultSyncTimeout)
	}

	return n, nil
}

// waitSynced waits until every synced says so, bounded by DefaultSyncTimeout.
// Polled every 10ms rather than cache.WaitForCacheSync's 100ms: every runner
// and every engine run starts here.
func waitSynced(ctx context.Context, synced ...cache.InformerSynced) error {
	return wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, DefaultSyncTimeout, true, func(context.Context) (bool, error) {
		for _, s := range synced {
			if !s() {
				return false, nil
			}
		}

		return true, nil
	})
}

// Stop stops the watch.
func (n *Nodes) Stop() { n.cancel() }

func (n *Nodes) notify() {
	n.mu.Lock()
	defer n.mu.Unlock()

	close(n.changed)
	n.changed = make(chan struct{})
}

// Cached returns the Node named name as the watch last saw it, of any age: for
// what a Node's last change does not matter to (its UID, a report).
func (n *Nodes) Cached(name string) (*corev1.Node, bool) {
	node, err := n.lister.Get(name)
	if err != nil {
		return nil, false
	}

	return node, true
}

// List returns every Node as the watch last saw them, by name.
func (n *Nodes) List() []*corev1.Node {
	nodes, _ := n.lister.List(labels.Everything())
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].Name < nodes[j].Name })

	return nodes
}

// Get returns the Node named name from the watch once it shows what the runner
// last wrote to it or read of it from the API server (at once when the runner
// did neither), waiting DefaultCatchUp at most; else, and for a Node the watch
// does not have, it reads it from the API server (temporary failures retried;
// a Node that does not exist is a NotFound error).
func (n *Nodes) Get(ctx context.Context, name string) (*corev1.Node, error) {
	timer := time.NewTimer(n.catchUp)
	defer timer.Stop()

	for {
		n.mu.Lock()
		changed := n.changed
		n.mu.Unlock()

		node, ok, behind := n.current(name)
		if ok {
			return node, nil
		}

		if !behind {
			break
		}

		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-timer.C:
			return n.read(ctx, name)
		case <-changed:
		}
	}

	return n.read(ctx, name)
}

// current returns the watch's Node named name when it is at least as new as
// what the runner last saw of it (ok), else whether waiting for the watch
// could make it so.
func (n *Nodes) current(name string) (node *corev1.Node, ok, behind bool) {
	n.mu.Lock()
	want := n.seen[name]
	n.mu.Unlock()

	node, err := n.lister.Get(name)

	switch {
	case err != nil:
		// Not in the watch: deleted, or registered a moment ago; the API server says.
		return nil, false, false
	case want == "" || node.ResourceVersion == want:
		return node, true, false
	}

	cmp, err := resourceversion.CompareResourceVersion(node.ResourceVersion, want)
	if err != nil {
		// Versions that do not compare (not etcd's): only the API server knows.
		return nil, false, false
	}

	return node, cmp >= 0, cmp < 0
}

// read reads the Node from the API server and remembers its version.
func (n *Nodes) read(ctx context.Context, name string) (*corev1.Node, error) {
	var node *corev1.Node

	err := Retry(ctx, 0, func(ctx context.Context) error {
		var err error

		node, err = n.client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})

		return err
	})
	if err != nil {
		return nil, err
	}

	n.saw(node)

	return node, nil
}

// saw remembers node's resourceVersion, as the runner wrote it or read it from
// the API server, unless it already knows a newer one.
func (n *Nodes) saw(node *corev1.Node) {
	if node == nil || node.ResourceVersion == "" {
		return
	}

	n.mu.Lock()
	defer n.mu.Unlock()

	if old, ok := n.seen[node.Name]; ok {
		if cmp, err := resourceversion.CompareResourceVersion(old, node.ResourceVersion); err == nil && cmp > 0 {
			return
		}
	}

	n.seen[node.Name] = node.ResourceVersion
}

// ReadCordon reads the Node from the API server, never the watch, and says how
// it stands: whether to cordon is decided on it, and a kubectl uncordon a
// moment ago, which the watch may not show yet, counts.
func (n *Nodes) ReadCordon(ctx context.Context, name string) (CordonState, error) {
	node, err := n.read(ctx, name)
	if err != nil {
		return 0, fmt.Errorf("node %q: read its cordon: %w", name, err)
	}

	return CordonOf(node), nil
}

// maxCordonTries bounds EnsureCordoned's writes refused because the Node changed.
const maxCordonTries = 3

// EnsureCordoned makes sure the node is unschedulable and carries ichor's mark,
// and says how it stood: CordonedByUs (nothing written), MarkedButSchedulable
// (cordoned again, the mark and its time kept) or NotCordonedByIchor (cordoned
// and marked now).
//
// What it writes depends on what it reads, so it never writes on a Node older
// than the API server's: it decides on the watch's Node, and writes only on the
// condition that the Node is still at that resourceVersion (the API server
// refuses the patch with a conflict otherwise). After a conflict, or when the
// watch says there is nothing to write (a kubectl uncordon a moment ago
// counts), it decides again on the Node read from the API server.
func (n *Nodes) EnsureCordoned(ctx context.Context, name string, now time.Time) (CordonState, error) {
	node, err := n.Get(ctx, name)
	fresh := false

	for tries := 1; ; tries++ {
		if err != nil {
			return 0, fmt.Errorf("node %q: read its cordon: %w", name, err)
		}

		state := CordonOf(node)

		switch {
		case state == CordonedByUs && fresh:
			return state, nil
		case !fresh && (state == CordonedByUs || node.ResourceVersion == ""):
			// Nothing to write, or no version to write on the condition of: the API
			// server says.
			node, err = n.read(ctx, name)
			fresh = true

			continue
		}

		var written *corev1.Node

		if state == MarkedButSchedulable {
			written, err = recordon(ctx, n.client, name, node.ResourceVersion)
		} else {
			written, err = patchNode(ctx, n.client, name, node.ResourceVersion, true, now.UTC().Format(time.RFC3339))
		}

		if err == nil {
			n.saw(written)

			return state, nil
		}

		if !apierrors.IsConflict(err) || tries == maxCordonTries {
			return 0, err
		}

		node, err = n.read(ctx, name)
		fresh = true
	}
}

// Uncordon is the package's Uncordon, remembered: a later Get shows it.
func (n *Nodes) Uncordon(ctx context.Context, name string) error {
	node, err := uncordon(ctx, n.client, name)
	n.saw(node)

	return err
}

// onChange registers h with the watch and returns when it has been given every
// Node, and how to remove it.
func (n *Nodes) onChange(h cache.ResourceEventHandler) (synced cache.InformerSynced, remove func(), err error) {
	reg, err := n.informer.AddEventHandler(h)
	if err != nil {
		return nil, nil, err
	}

	return reg.HasSynced, func() { _ = n.informer.RemoveEventHandler(reg) }, nil
}
