package discovery_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stesting "k8s.io/client-go/testing"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/discovery/discoverytest"
)

func TestDiscoverThreePlusTwo(t *testing.T) {
	c := discoverytest.ThreePlusTwo().PDB("default", "web", 0, 2)
	c.Node("worker-2").Hold = discoverytest.Ptr("disk replacement")
	c.Node("worker-1").Order = "5"
	c.Node("cp-2").Registry = "registry.example.com:5000/mirror"

	snap := c.Snapshot(t)

	require.Len(t, snap.Nodes, 5)
	assert.Equal(t, discoverytest.Endpoint, snap.Endpoint)

	cp2, _ := snap.Node("cp-2")
	assert.True(t, cp2.ControlPlane)
	assert.Equal(t, "10.0.0.12", cp2.InternalIP)
	assert.Equal(t, "v1.35.4", cp2.KubeletVersion)
	assert.True(t, cp2.Ready)
	assert.True(t, cp2.IsTalos())
	assert.Equal(t, "registry.example.com:5000/mirror/kube-apiserver:v1.35.4", cp2.StaticPods[discovery.APIServer].Image)
	assert.True(t, cp2.StaticPods[discovery.Scheduler].Ready)
	assert.Equal(t, "1", cp2.StaticPods[discovery.ControllerManager].ConfigVersion)
	require.NotNil(t, cp2.Talos)
	assert.Equal(t, "v1.13.9", cp2.Talos.Version)
	assert.Equal(t, "registry.example.com:5000/mirror/kube-apiserver:v1.35.4", cp2.Talos.Images[discovery.APIServer])
	assert.Equal(t, "ghcr.io/siderolabs/installer:v1.13.9", cp2.Talos.InstallImage)
	assert.True(t, cp2.Talos.APIAccess.Enabled)
	assert.Len(t, cp2.Talos.Images, 5)

	w1, _ := snap.Node("worker-1")
	assert.False(t, w1.ControlPlane)
	assert.Equal(t, "5", w1.Order)
	assert.Empty(t, w1.StaticPods)
	assert.Equal(t, map[discovery.Component]string{discovery.Kubelet: "ghcr.io/siderolabs/kubelet:v1.35.4"}, w1.Talos.Images)

	w2, _ := snap.Node("worker-2")
	assert.True(t, w2.Held)
	assert.Equal(t, "disk replacement", w2.HoldReason)

	assert.True(t, snap.KubeProxy.Present)
	assert.Equal(t, []discovery.PDB{{Namespace: "default", Name: "web", DisruptionsAllowed: 0, ExpectedPods: 2}}, snap.PDBs)
}

func TestDiscoverKubeProxyAbsent(t *testing.T) {
	snap := discoverytest.ThreePlusTwo().WithoutKubeProxy().Snapshot(t)

	assert.False(t, snap.KubeProxy.Present)
}

func TestDiscoverSkipsTalosForNodesThatAreNotTalos(t *testing.T) {
	c := discoverytest.ThreePlusTwo()
	c.Node("worker-2").OSImage = "Ubuntu 24.04 LTS"

	talos := c.Talos()
	talos.Errors["10.0.0.22"] = errors.New("must not be called")

	d := &discovery.Discoverer{Kube: c.Clientset(), Talos: talos}

	snap, err := d.Discover(context.Background())
	require.NoError(t, err)

	w2, _ := snap.Node("worker-2")
	assert.False(t, w2.IsTalos())
	assert.Nil(t, w2.Talos)
}

// A held node that is down (held, as plan advises for a NotReady node) leaves its Talos
// side unread; the same node not held fails discovery, naming it.
func TestDiscoverHeldNodeTalosUnreachable(t *testing.T) {
	c := discoverytest.ThreePlusTwo()
	c.Node("worker-2").Hold = discoverytest.Ptr("powered off")

	talos := c.Talos()
	talos.Errors["10.0.0.22"] = status.Error(codes.Unavailable, "connection refused")

	snap, err := (&discovery.Discoverer{Kube: c.Clientset(), Talos: talos}).Discover(context.Background())
	require.NoError(t, err)

	w2, _ := snap.Node("worker-2")
	assert.True(t, w2.Held)
	assert.Nil(t, w2.Talos, "not read")

	w1, _ := snap.Node("worker-1")
	assert.NotNil(t, w1.Talos)

	c.Node("worker-2").Hold = nil
	_, err = (&discovery.Discoverer{Kube: c.Clientset(), Talos: talos}).Discover(context.Background())
	require.ErrorContains(t, err, `node "worker-2"`)
}

// The number of Kubernetes requests must not grow with the node count.
func TestDiscoverRequestsDoNotGrowWithNodes(t *testing.T) {
	count := func(workers int) int {
		c := discoverytest.ThreePlusTwo()
		for i := 3; i < workers+3; i++ {
			c.Worker(fmt.Sprintf("worker-%d", i), fmt.Sprintf("10.0.1.%d", i))
		}

		cs := c.Clientset()
		d := &discovery.Discoverer{Kube: cs, Talos: c.Talos()}

		_, err := d.Discover(context.Background())
		require.NoError(t, err)

		return len(cs.Actions())
	}

	assert.Equal(t, 4, count(0))
	assert.Equal(t, count(0), count(200))
}

func TestDiscoverErrors(t *testing.T) {
	forbidden := func(resource string) k8stesting.ReactionFunc {
		return func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: resource}, "", errors.New("RBAC"))
		}
	}

	tests := []struct {
		name     string
		verb     string
		resource string
		react    k8stesting.ReactionFunc
		talosErr error
		want     []string
	}{
		{
			name: "nodes forbidden", verb: "list", resource: "nodes", react: forbidden("nodes"),
			want: []string{`RBAC denied "list" on "nodes" at cluster scope`, "kubectl auth can-i list nodes -A"},
		},
		{
			name: "pods forbidden", verb: "list", resource: "pods", react: forbidden("pods"),
			want: []string{`"list" on "pods" in namespace kube-system`, "-n kube-system"},
		},
		{
			name: "pdbs forbidden", verb: "list", resource: "poddisruptionbudgets", react: forbidden("poddisruptionbudgets"),
			want: []string{`"poddisruptionbudgets.policy"`},
		},
		{
			name: "kube-proxy forbidden", verb: "get", resource: "daemonsets", react: forbidden("daemonsets"),
			want: []string{`"get" on "daemonsets.apps"`},
		},
		{
			name: "kubernetes unreachable", verb: "list", resource: "nodes",
			react: func(k8stesting.Action) (bool, runtime.Object, error) {
				return true, nil, apierrors.NewServiceUnavailable("connection refused")
			},
			want: []string{"kubernetes API at https://192.168.0.100:6443 unreachable", "check --kubeconfig and --context"},
		},
		{
			name: "talos unreachable", talosErr: status.Error(codes.Unavailable, "connection refused"),
			want: []string{`node "cp-1"`, "talos API at 10.0.0.11 unreachable", "check --talos-endpoints"},
		},
		{
			name: "talos denied", talosErr: status.Error(codes.PermissionDenied, "not authorized"),
			want: []string{`node "cp-1"`, "role os:reader"},
		},
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := discoverytest.ThreePlusTwo()
			cs := c.Clientset()

			if tt.react != nil {
				cs.PrependReactor(tt.verb, tt.resource, tt.react)
			}

			talos := c.Talos()
			if tt.talosErr != nil {
				talos.Errors["10.0.0.11"] = tt.talosErr
			}

			d := &discovery.Discoverer{Kube: cs, Endpoint: discoverytest.Endpoint, Talos: talos, Concurrency: 1}

			_, err := d.Discover(context.Background())
			require.Error(t, err)

			for _, w := range tt.want {
				assert.Contains(t, err.Error(), w)
			}

			assert.NotContains(t, err.Error(), "\n")
			assert.False(t, strings.HasSuffix(err.Error(), " "))
		})
	}
}
