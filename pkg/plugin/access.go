package plugin

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/job"
	"github.com/ichor-dev/kubectl-ichor/pkg/planning"
)

// manifestAccess computes the Job's access to Talos' bootstrap manifests (job.ComputeAccess)
// from the manifests themselves, read through Talos from the first control plane that
// answers; kinds are mapped with the cluster's discovery.
func (f *factory) manifestAccess(ctx context.Context) (job.ManifestAccess, error) {
	if f.deps.talos == nil || f.deps.kube == nil {
		return job.ManifestAccess{}, errNoManifestReader
	}

	target, err := f.Kube()
	if err != nil {
		return job.ManifestAccess{}, err
	}

	return f.computeAccess(ctx, target.client)
}

var errNoManifestReader = errors.New("no Talos connection to read the bootstrap manifests")

func (f *factory) computeAccess(ctx context.Context, kube kubernetes.Interface) (job.ManifestAccess, error) {
	reader, err := f.Talos(ctx)
	if err != nil {
		return job.ManifestAccess{}, err
	}

	mr, ok := planning.Capable[planning.ManifestReader](reader)
	if !ok {
		return job.ManifestAccess{}, errors.New("this Talos client cannot read the bootstrap manifests")
	}

	nodes, err := kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: discovery.ControlPlaneLabel})
	if err != nil {
		return job.ManifestAccess{}, fmt.Errorf("list the control planes: %w", err)
	}

	var (
		objs []*unstructured.Unstructured
		errs []error
		read bool
	)

	for _, n := range nodes.Items {
		ip := internalIP(n.Status.Addresses)
		if ip == "" {
			continue
		}

		if objs, err = mr.Manifests(ctx, ip); err == nil {
			read = true

			break
		}

		errs = append(errs, fmt.Errorf("node %q: %w", n.Name, err))
	}

	if !read {
		if len(errs) == 0 {
			return job.ManifestAccess{}, errors.New("no control plane with an InternalIP to read the bootstrap manifests from")
		}

		return job.ManifestAccess{}, errors.Join(errs...)
	}

	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(kube.Discovery()))

	return job.ComputeAccess(objs, mapper)
}

func internalIP(addrs []corev1.NodeAddress) string {
	for _, a := range addrs {
		if a.Type == "InternalIP" {
			return a.Address
		}
	}

	return ""
}
