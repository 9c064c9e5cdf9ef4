package plugin

import (
	"context"
	"errors"
	"fmt"
	"io"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/job"
)

// manifestReader reads the bootstrap manifests a control plane renders; *talos.Client
// has it.
type manifestReader interface {
	Manifests(ctx context.Context, node string) ([]*unstructured.Unstructured, error)
}

// manifestAccess computes the Job's access to Talos' bootstrap manifests (job.ComputeAccess)
// from the manifests themselves, read through Talos from the first control plane that
// answers; kinds are mapped with the cluster's discovery.
func (d deps) manifestAccess(ctx context.Context, flags *globalFlags) (job.ManifestAccess, error) {
	if d.talos == nil || d.kube == nil {
		return job.ManifestAccess{}, errNoManifestReader
	}

	target, err := d.kube(flags.kube)
	if err != nil {
		return job.ManifestAccess{}, err
	}

	return d.computeAccess(ctx, flags, target.client)
}

var errNoManifestReader = errors.New("no Talos connection to read the bootstrap manifests")

func (d deps) computeAccess(ctx context.Context, flags *globalFlags, kube kubernetes.Interface) (job.ManifestAccess, error) {
	reader, err := d.talos(ctx, flags.talos)
	if err != nil {
		return job.ManifestAccess{}, err
	}

	if c, isCloser := reader.(io.Closer); isCloser {
		defer c.Close() //nolint:errcheck
	}

	mr, ok := capable[manifestReader](reader)
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
