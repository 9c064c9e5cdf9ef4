package kubelet

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// fakeMachine is a machine that is up and never changes.
type fakeMachine struct {
	name string
	ip   netip.Addr
}

func (m fakeMachine) Name() string       { return m.name }
func (m fakeMachine) IP() netip.Addr     { return m.ip }
func (m fakeMachine) ControlPlane() bool { return false }
func (m fakeMachine) Current() MachineState {
	return MachineState{Up: true, TalosVersion: "v1.14.1", BootID: "b", KubeletImage: "ghcr.io/siderolabs/kubelet:v1.36.3", KubeletRunning: true}
}
func (m fakeMachine) Changes() (<-chan struct{}, func()) { return make(chan struct{}), func() {} }
func (m fakeMachine) Observe(Observed)                   {}

// leaseActions are the Lease requests made since the last call.
func leaseActions(c *fake.Clientset) []string {
	var out []string
	for _, a := range c.Actions() {
		if a.GetResource().Resource == "leases" {
			out = append(out, a.GetVerb())
		}
	}
	c.ClearActions()
	return out
}

// A renewal writes the Lease it last wrote, as the kubelet's lease
// controller does: one request, no read; after a failed write it reads the
// Lease again.
func TestLeaseRenewedInPlace(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset()
	k := &Kubelets{opts: Options{Client: client, Log: slog.New(slog.DiscardHandler)}, nodes: map[string]*node{}, pods: map[string]*podRunner{}}
	n := newNode(k, fakeMachine{name: "worker-1", ip: netip.MustParseAddr("127.0.0.10")})
	require.NoError(t, n.register(ctx))
	client.ClearActions()

	n.renewLease(ctx)
	require.Equal(t, []string{"get", "create"}, leaseActions(client), "the first: none yet")

	for range 3 {
		n.lastLease = time.Time{} // due
		n.renewLease(ctx)
		require.Equal(t, []string{"update"}, leaseActions(client))
	}
	l, err := client.CoordinationV1().Leases(leaseNamespace).Get(ctx, "worker-1", metav1.GetOptions{})
	require.NoError(t, err)
	require.NotNil(t, l.Spec.RenewTime)
	client.ClearActions()

	// Another writer: the cached Lease is stale, its write conflicts.
	conflicts := 1
	client.PrependReactor("update", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		if conflicts == 0 {
			return false, nil, nil
		}
		conflicts--
		return true, nil, apierrors.NewConflict(schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}, "worker-1", fmt.Errorf("changed"))
	})
	n.lastLease = time.Time{}
	n.renewLease(ctx)
	require.Equal(t, []string{"update", "get", "update"}, leaseActions(client), "read again after the conflict, then written")
	n.lastLease = time.Time{}
	n.renewLease(ctx)
	require.Equal(t, []string{"update"}, leaseActions(client))
}

func TestRegisterAll(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset()
	k := &Kubelets{opts: Options{Client: client, Log: slog.New(slog.DiscardHandler)}, nodes: map[string]*node{}, pods: map[string]*podRunner{}}
	var nodes []*node
	for i := range 3*registerParallel + 1 {
		nodes = append(nodes, newNode(k, fakeMachine{name: fmt.Sprintf("worker-%d", i+1), ip: netip.AddrFrom4([4]byte{127, 0, 1, byte(i)})}))
	}
	require.NoError(t, registerAll(ctx, nodes))
	list, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	require.Len(t, list.Items, len(nodes))
	for _, n := range nodes {
		require.True(t, n.registered, n.name)
	}

	// A failure names its node.
	client.PrependReactor("create", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, fmt.Errorf("refused")
	})
	err = registerAll(ctx, []*node{newNode(k, fakeMachine{name: "worker-99", ip: netip.MustParseAddr("127.0.2.1")})})
	require.ErrorContains(t, err, "node worker-99: register: refused")
}
