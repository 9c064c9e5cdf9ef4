package planning

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/checks"
	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/discovery/discoverytest"
	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
	"github.com/ichor-dev/kubectl-ichor/pkg/talos"
)

// wrapper has every call of the fake, as the plugin's request counter does, and says
// what it wraps with Unwrap.
type wrapper struct {
	*discoverytest.FakeTalos
	inner discovery.TalosReader
}

func (w wrapper) Unwrap() discovery.TalosReader { return w.inner }

// onlyTalos is a Talos client that can make only the basic calls.
type onlyTalos struct{ discovery.TalosReader }

// failingManifests cannot read the bootstrap manifests.
type failingManifests struct{ *discoverytest.FakeTalos }

func (failingManifests) Manifests(context.Context, string) ([]*unstructured.Unstructured, error) {
	return nil, errors.New("connection refused")
}

func TestCapableSeesThroughAWrapper(t *testing.T) {
	fake := discoverytest.ThreePlusTwo().Talos()

	_, ok := Capable[ManifestReader](fake)
	assert.True(t, ok, "the fake reads manifests")

	_, ok = Capable[ManifestReader](onlyTalos{fake})
	assert.False(t, ok, "a client without the call")

	_, ok = Capable[ManifestReader](wrapper{FakeTalos: fake, inner: onlyTalos{fake}})
	assert.False(t, ok, "a wrapper is capable only where what it wraps is")

	_, ok = Capable[ManifestReader](wrapper{FakeTalos: fake, inner: fake})
	assert.True(t, ok)
}

// Read takes the bootstrap manifests from the first control plane not held, says why
// when they cannot be read, and refuses a Talos plan's read on a client that cannot read
// the system extensions.
func TestReadTheManifestsOfTheFirstControlPlaneNotHeld(t *testing.T) {
	c := discoverytest.ThreePlusTwo()
	c.Node("cp-1").Hold = discoverytest.Ptr("disk swap")

	fake := c.Talos()
	obj := &unstructured.Unstructured{}
	obj.SetAPIVersion("v1")
	obj.SetKind("ServiceAccount")
	obj.SetName("flannel")
	fake.ManifestObjects = map[string][]*unstructured.Unstructured{"10.0.0.12": {obj}}

	cl, err := Read(context.Background(), Clients{Kube: c.Clientset(), Endpoint: discoverytest.Endpoint, Talos: fake}, Reads{})
	require.NoError(t, err)
	assert.Equal(t, "cp-2", cl.Manifests.Node)
	assert.Len(t, cl.Manifests.Objects, 1)
	assert.Nil(t, cl.Etcd, "etcd not asked for")

	cl, err = Read(context.Background(), Clients{Kube: c.Clientset(), Endpoint: discoverytest.Endpoint, Talos: failingManifests{fake}}, Reads{})
	require.NoError(t, err, "a manifest read failing is the check's to say")
	assert.ErrorContains(t, cl.Manifests.Err, "connection refused")

	_, err = Read(context.Background(), Clients{Kube: c.Clientset(), Endpoint: discoverytest.Endpoint, Talos: onlyTalos{c.Talos()}}, Reads{Installed: true})
	assert.EqualError(t, err, "this Talos client cannot read the nodes' system extensions")
}

// Evaluate previews the drains and runs the checks it is given: a Kubernetes plan's
// invariant row, runnable.
func TestEvaluateRunsTheChecks(t *testing.T) {
	c := discoverytest.ThreePlusTwo()
	clients := Clients{Kube: c.Clientset(), Endpoint: discoverytest.Endpoint, Talos: c.Talos()}

	cl, err := Read(context.Background(), clients, Reads{})
	require.NoError(t, err)

	target := stages.MustParseVersion("v1.36.3")
	plan, err := stages.PlanKubernetes(cl.Snapshot, target, stages.Options{MaxUnavailable: 1})
	require.NoError(t, err)

	require.NoError(t, Evaluate(context.Background(), clients, cl, plan, Checking{
		Target: target, Namespace: "ichor-system", DryRunManifests: true, Checks: []checks.Check{checks.Invariant{}},
	}))

	require.Len(t, plan.Checks, 1)
	assert.Equal(t, "invariant", plan.Checks[0].Name)
	assert.Equal(t, api.ResultOK, plan.Checks[0].Result)
	assert.True(t, plan.Runnable)
	assert.NotEmpty(t, plan.Drains, "the drains previewed")
}

// etcdFirst is a Talos client whose nodes answer their version only once etcd has
// been asked for its status: a Read that looks at etcd after the Talos side waits
// for nothing (here, for its calls' bound).
type etcdFirst struct {
	*discoverytest.FakeTalos
	asked chan struct{}
	once  sync.Once
}

func (e *etcdFirst) Version(ctx context.Context, node string) (string, error) {
	select {
	case <-e.asked:
		return e.FakeTalos.Version(ctx, node)
	case <-ctx.Done():
		return "", ctx.Err()
	case <-time.After(3 * time.Second):
		return "", errors.New("etcd was not asked beside the Talos reads")
	}
}

func (e *etcdFirst) EtcdStatus(_ context.Context, ip string) (talos.EtcdStatus, error) {
	e.once.Do(func() { close(e.asked) })

	id := map[string]uint64{"10.0.0.11": 1, "10.0.0.12": 2, "10.0.0.13": 3}[ip]

	return talos.EtcdStatus{MemberID: id, Leader: 1, RaftIndex: 100, RaftAppliedIndex: 100, RaftTerm: 2}, nil
}

func (e *etcdFirst) EtcdMembers(context.Context, string) ([]talos.EtcdMember, error) {
	return []talos.EtcdMember{{ID: 1, Hostname: "cp-1"}, {ID: 2, Hostname: "cp-2"}, {ID: 3, Hostname: "cp-3"}}, nil
}

func (e *etcdFirst) EtcdAlarms(context.Context, string) ([]talos.EtcdAlarm, error) { return nil, nil }

// TestReadLooksAtEtcdBesideTheNodes: a Talos plan's look at etcd starts once the Nodes
// are listed, beside the reads of their Talos side, not after them: its passes are a
// second apart whatever else is read. The view and both passes are the Cluster's.
func TestReadLooksAtEtcdBesideTheNodes(t *testing.T) {
	c := discoverytest.ThreePlusTwo()
	fake := &etcdFirst{FakeTalos: c.Talos(), asked: make(chan struct{})}

	cl, err := Read(context.Background(), Clients{Kube: c.Clientset(), Endpoint: discoverytest.Endpoint, Talos: fake}, Reads{Etcd: true})
	require.NoError(t, err)
	require.NotNil(t, cl.Etcd)
	assert.True(t, cl.Etcd.Judge("").Healthy(), cl.Etcd.Judge("").Describe())
	assert.Len(t, cl.EtcdPasses, 2)
}
