package planning

import (
	"context"
	"errors"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/ichor-dev/kubectl-ichor/pkg/checks"
	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
)

// Clients are the APIs the pipeline reads, with the operator's credentials.
type Clients struct {
	// Kube is the Kubernetes API.
	Kube kubernetes.Interface
	// Dynamic dry-runs the bootstrap manifests; nil skips the dry run.
	Dynamic dynamic.Interface
	// Endpoint is the Kubernetes API's address, as the kubeconfig names it.
	Endpoint string
	// Metrics reads the apiserver's metrics (the removed APIs check).
	Metrics checks.MetricsReader
	// Talos is the Talos API.
	Talos discovery.TalosReader
}

// Reads says what Read reads beyond the nodes.
type Reads struct {
	// Installed reads each node's system extensions and schematic (a Talos upgrade keeps
	// them); a Talos client that cannot is an error.
	Installed bool
	// Staged reads each node's persistent machine config (the staged config check: a
	// Talos upgrade's reboot would activate a staged change).
	Staged bool
	// Etcd reads etcd through the control planes (a Talos plan's etcd check).
	Etcd bool
}

// Cluster is what Read read.
type Cluster struct {
	// Snapshot is the nodes as the Kubernetes and Talos APIs show them.
	Snapshot *discovery.Snapshot
	// Etcd is etcd as the control planes show it; nil when not read, or when the Talos
	// client cannot read it (the check says so).
	Etcd *stages.EtcdView
	// EtcdPasses are the passes Etcd was read from, for the launch to hand to the
	// runner's first read of etcd (see engine.EtcdPassMemo).
	EtcdPasses []stages.EtcdPass
	// Manifests are the first control plane's bootstrap manifests.
	Manifests Manifests
}

// Manifests are the bootstrap manifests one control plane renders.
type Manifests struct {
	// Node is the control plane they were read from; "" when none could be.
	Node string
	// Objects are the manifests' objects.
	Objects []*unstructured.Unstructured
	// Err is why they could not be read.
	Err error
}

// ManifestReader reads the bootstrap manifests a control plane renders; *talos.Client
// has it.
type ManifestReader interface {
	Manifests(ctx context.Context, node string) ([]*unstructured.Unstructured, error)
}

// Read reads the cluster.
func Read(ctx context.Context, c Clients, r Reads) (*Cluster, error) {
	d := &discovery.Discoverer{Kube: c.Kube, Endpoint: c.Endpoint, Talos: c.Talos}

	if r.Installed {
		ir, ok := Capable[discovery.InstalledReader](c.Talos)
		if !ok {
			return nil, errors.New("this Talos client cannot read the nodes' system extensions")
		}

		d.Installed = ir
	}

	if r.Staged {
		if pr, ok := Capable[discovery.PersistentReader](c.Talos); ok {
			d.Persistent = pr
		}
	}

	// Etcd is read beside the nodes' Talos side, from the moment the Nodes are listed:
	// its two passes are a second apart whatever else is read.
	var etcd <-chan etcdRead

	if er, ok := Capable[stages.EtcdReader](c.Talos); ok && r.Etcd {
		ectx, cancel := context.WithCancel(ctx)
		defer cancel()

		ch := make(chan etcdRead, 1)
		etcd = ch
		d.Listed = func(nodes []discovery.Node) {
			go func() { ch <- readEtcd(ectx, er, nodes) }()
		}
	}

	snap, err := d.Discover(ctx)
	if err != nil {
		return nil, err
	}

	out := &Cluster{Snapshot: snap}

	if mr, ok := Capable[ManifestReader](c.Talos); ok {
		for _, n := range snap.Nodes {
			if n.ControlPlane && !n.Held && n.IsTalos() && n.InternalIP != "" {
				out.Manifests.Node = n.Name
				out.Manifests.Objects, out.Manifests.Err = mr.Manifests(ctx, n.InternalIP)

				break
			}
		}
	}

	if etcd != nil {
		read := <-etcd
		out.Etcd, out.EtcdPasses = read.view, read.passes
	}

	return out, nil
}

// etcdRead is a read of etcd: its view and its passes.
type etcdRead struct {
	view   *stages.EtcdView
	passes []stages.EtcdPass
}

// readEtcd reads etcd through the control planes' Talos APIs, in two passes a
// gap apart: the view and its passes.
func readEtcd(ctx context.Context, r stages.EtcdReader, nodes []discovery.Node) etcdRead {
	var controlPlanes []stages.EtcdNode

	for _, n := range nodes {
		if n.ControlPlane {
			controlPlanes = append(controlPlanes, stages.EtcdNode{Name: n.Name, IP: n.InternalIP})
		}
	}

	chain := &stages.EtcdChain{Reader: r, ControlPlanes: controlPlanes}
	v := chain.Read(ctx)

	return etcdRead{view: v, passes: chain.Passes()}
}

// Capable returns r as a T when r can make T's calls: a wrapper (one with
// Unwrap() discovery.TalosReader) is a T only when the reader it wraps is one.
func Capable[T any](r discovery.TalosReader) (T, bool) {
	inner := r
	if w, ok := r.(interface{ Unwrap() discovery.TalosReader }); ok {
		inner = w.Unwrap()
	}

	if _, ok := inner.(T); !ok {
		var none T

		return none, false
	}

	t, ok := r.(T)

	return t, ok
}
