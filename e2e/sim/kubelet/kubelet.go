package kubelet

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/ichor-dev/kubectl-ichor/e2e/sim/events"
	"github.com/ichor-dev/kubectl-ichor/e2e/sim/faults"
)

// StaticPod is a control-plane static pod as the machine renders it.
type StaticPod struct {
	Image string
	// ConfigVersion is the version of the Talos controlplane config resource
	// that produced the pod (annotation talos.dev/config-version).
	ConfigVersion string
}

// MachineState is what a kubelet observes of its Talos machine.
type MachineState struct {
	Up bool
	// PowerLost tells that the machine is down because it lost its power
	// (the poweredOff fault), not by a shutdown or a reboot: its kubelet
	// posts nothing on the way down (no NotReady, no pod's end), and the
	// node lifecycle controller marks the Node Unknown after its grace.
	PowerLost    bool
	TalosVersion string
	BootID       string
	KubeletImage string
	// KubeletRunning tells whether Talos runs the kubelet service: the
	// kubelet works only then (the service restarts for a new spec).
	KubeletRunning bool
	StaticPods     map[string]StaticPod
}

// Observed is what Talos reads from its kubelet and the Node: the Node's
// Ready condition (Talos watches the Node) and the static pods the kubelet
// runs with their statuses, by "namespace/name" (Talos polls the kubelet's
// pod list).
type Observed struct {
	NodeReady  bool
	StaticPods map[string]corev1.PodStatus
}

// Machine is the simulated Talos machine a kubelet runs on.
type Machine interface {
	Name() string
	IP() netip.Addr
	ControlPlane() bool
	Current() MachineState
	// Changes notifies (coalesced) whenever Current may have changed.
	Changes() (<-chan struct{}, func())
	// Observe tells the machine what its kubelet shows now.
	Observe(Observed)
}

// Options configure the kubelets.
type Options struct {
	Client     kubernetes.Interface
	RestConfig *rest.Config
	Events     *events.Log
	Faults     *faults.Store
	Log        *slog.Logger

	StaticPodRestart time.Duration
	Ready            time.Duration
	PodStart         time.Duration

	// Images maps an image repository to the directory standing for its
	// root filesystem; pods with such an image run as processes.
	Images map[string]string
	// PodDir is where pod volumes are materialized; LogDir where container
	// output goes.
	PodDir, LogDir string
	// APIServer is the address in-cluster clients reach the apiserver at.
	APIServer netip.AddrPort
	// Hosts are /etc/hosts entries given to process pods (name -> its
	// addresses, as a Service with several endpoints resolves).
	Hosts map[string][]string
	// ExecPod is the command (argv) that starts a process pod: it is given
	// "--spec FILE" and runs the container inside a private mount namespace
	// (see RunPod).
	ExecPod []string
	// CACert and the serving cert/key of the kubelet API (container logs)
	// endpoints, listened on each node's IP:10250.
	ServingCert, ServingKey []byte
	// ClientCA verifies the apiserver's client certificate on that API.
	ClientCA []byte
}

// Kubelets runs one simulated kubelet per machine.
type Kubelets struct {
	opts  Options
	nodes map[string]*node

	podsMu sync.Mutex
	pods   map[string]*podRunner // by pod UID
	wg     sync.WaitGroup

	// nodeLister is one watch of every Node, for each kubelet to compare its
	// Node's status with what it would post (see repostIfStale).
	nodeLister corelisters.NodeLister
}

// Start registers the node of every machine that is up and starts every
// kubelet. It returns once those Nodes exist; Ready tells when they are
// Ready. The kubelet of a machine not up yet registers its Node when the
// machine boots.
func Start(ctx context.Context, opts Options, machines []Machine) (*Kubelets, error) {
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	k := &Kubelets{opts: opts, nodes: map[string]*node{}, pods: map[string]*podRunner{}}
	factory := informers.NewSharedInformerFactory(opts.Client, 0)
	k.nodeLister = factory.Core().V1().Nodes().Lister()
	var up []*node
	for _, m := range machines {
		n := newNode(k, m)
		// A machine that has not booted yet (powered off) registers its
		// Node when it first boots, as a joining node's kubelet does.
		if m.Current().Up {
			up = append(up, n)
		}
		k.nodes[m.Name()] = n
	}
	if err := registerAll(ctx, up); err != nil {
		return nil, err
	}
	for _, n := range k.nodes {
		k.wg.Add(1)
		go func() {
			defer k.wg.Done()
			n.run(ctx)
		}()
		if err := n.serveAPI(ctx); err != nil {
			return nil, fmt.Errorf("node %s: kubelet API: %w", n.name, err)
		}
	}
	podInformer := factory.Core().V1().Pods().Informer()
	_, err := podInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { k.podChanged(ctx, obj) },
		UpdateFunc: func(_, obj any) { k.podChanged(ctx, obj) },
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			k.podDeleted(obj)
		},
	})
	if err != nil {
		return nil, err
	}
	factory.Start(ctx.Done())
	return k, nil
}

// registerParallel is how many Nodes register at once: each is three
// requests, and thousands of them one after another are minutes of a large
// cluster's start.
const registerParallel = 16

// registerAll registers the nodes' Nodes, registerParallel at a time, and
// returns the first error.
func registerAll(ctx context.Context, nodes []*node) error {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	slots := make(chan struct{}, registerParallel)
	for _, n := range nodes {
		slots <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-slots; wg.Done() }()
			if err := n.register(ctx); err != nil {
				mu.Lock()
				if first == nil {
					first = fmt.Errorf("node %s: register: %w", n.name, err)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return first
}

// Wait waits for every kubelet goroutine to end (after ctx is cancelled).
func (k *Kubelets) Wait() {
	k.wg.Wait()
	k.podsMu.Lock()
	runners := make([]*podRunner, 0, len(k.pods))
	for _, r := range k.pods {
		runners = append(runners, r)
	}
	k.podsMu.Unlock()
	for _, r := range runners {
		r.stopProcesses(2 * time.Second)
	}
}

func (k *Kubelets) podChanged(ctx context.Context, obj any) {
	pod, ok := obj.(*corev1.Pod)
	if !ok || pod.Spec.NodeName == "" || isMirror(pod) {
		return
	}
	n := k.nodes[pod.Spec.NodeName]
	if n == nil {
		return
	}
	k.podsMu.Lock()
	r := k.pods[string(pod.UID)]
	if r == nil {
		if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
			if pod.DeletionTimestamp == nil {
				k.podsMu.Unlock()
				return
			}
		}
		r = newPodRunner(k, n, pod)
		k.pods[string(pod.UID)] = r
		k.wg.Add(1)
		go func() {
			defer k.wg.Done()
			r.run(ctx)
			k.podsMu.Lock()
			delete(k.pods, string(pod.UID))
			k.podsMu.Unlock()
		}()
	}
	k.podsMu.Unlock()
	r.update(pod)
}

func (k *Kubelets) podDeleted(obj any) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	k.podsMu.Lock()
	r := k.pods[string(pod.UID)]
	k.podsMu.Unlock()
	if r != nil {
		r.gone()
	}
}

// runnersOn returns the pod runners of a node.
func (k *Kubelets) runnersOn(nodeName string) []*podRunner {
	k.podsMu.Lock()
	defer k.podsMu.Unlock()
	var out []*podRunner
	for _, r := range k.pods {
		if r.n.name == nodeName {
			out = append(out, r)
		}
	}
	return out
}

// imageRoot returns the root directory standing for image, if it runs as a
// process.
func (k *Kubelets) imageRoot(image string) (string, bool) {
	repo := image
	if i := strings.Index(repo, "@"); i >= 0 {
		repo = repo[:i]
	}
	if i := strings.LastIndex(repo, ":"); i > strings.LastIndex(repo, "/") {
		repo = repo[:i]
	}
	dir, ok := k.opts.Images[repo]
	return dir, ok
}

func isMirror(pod *corev1.Pod) bool {
	_, ok := pod.Annotations[corev1.MirrorPodAnnotationKey]
	return ok
}

// VersionOf returns the tag of an image reference ("" when it has none).
func VersionOf(image string) string {
	if i := strings.Index(image, "@"); i >= 0 {
		image = image[:i]
	}
	if i := strings.LastIndex(image, ":"); i > strings.LastIndex(image, "/") {
		return image[i+1:]
	}
	return ""
}

func nodeCapacity() corev1.ResourceList {
	return corev1.ResourceList{
		corev1.ResourceCPU:              resource.MustParse("4"),
		corev1.ResourceMemory:           resource.MustParse("8Gi"),
		corev1.ResourcePods:             resource.MustParse("110"),
		corev1.ResourceEphemeralStorage: resource.MustParse("50Gi"),
	}
}
