package talosapi_test

import (
	"context"
	"testing"
	"time"

	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/siderolabs/talos/pkg/machinery/client"
	clusterres "github.com/siderolabs/talos/pkg/machinery/resources/cluster"
	configres "github.com/siderolabs/talos/pkg/machinery/resources/config"
	"github.com/siderolabs/talos/pkg/machinery/resources/k8s"
	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	"github.com/siderolabs/talos/pkg/machinery/resources/v1alpha1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
)

// The Talos API answers machinery's client as Talos does for the resources
// and calls talosctl uses: names and aliases resolve through the meta
// namespace, Talos' access policy refuses writes and unregistered types,
// and the services are listed and restarted as machined does.
func TestResourcesAsTalosServesThem(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	cl := c.client(t, c.talosconf)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cpCtx, wCtx := client.WithNode(ctx, c.cpIP), client.WithNode(ctx, c.wIP)

	t.Run("names resolve as talosctl get resolves them", func(t *testing.T) {
		for name, want := range map[string]struct {
			typ resource.Type
			ns  resource.Namespace
		}{
			"machineconfig":   {configres.MachineConfigType, configres.NamespaceName},
			"members":         {clusterres.MemberType, clusterres.NamespaceName},
			"services":        {v1alpha1.ServiceType, v1alpha1.NamespaceName},
			"staticpodstatus": {k8s.StaticPodStatusType, k8s.NamespaceName},
			"podstatus":       {k8s.StaticPodStatusType, k8s.NamespaceName},
			"nodename":        {k8s.NodenameType, k8s.NamespaceName},
			"machinestatus":   {runtime.MachineStatusType, runtime.NamespaceName},
			"manifeststatus":  {k8s.ManifestStatusType, k8s.ControlPlaneNamespaceName},
		} {
			var ns resource.Namespace
			rd, err := cl.ResolveResourceKind(wCtx, &ns, name)
			require.NoError(t, err, name)
			assert.Equal(t, want.typ, rd.TypedSpec().Type, name)
			assert.Equal(t, want.ns, ns, name)
		}
		var ns resource.Namespace
		_, err := cl.ResolveResourceKind(wCtx, &ns, "nosuchthing")
		assert.Equal(t, codes.NotFound, client.StatusCode(err))
		assert.ErrorContains(t, err, `resource "nosuchthing" is not registered`)
	})

	t.Run("access policy", func(t *testing.T) {
		_, err := safe.StateGetByID[*runtime.ImageFactorySchematic](cpCtx, cl.COSI, "schematic")
		assert.Equal(t, codes.PermissionDenied, client.StatusCode(err), "Talos 1.12 has no such type")
		assert.ErrorContains(t, err, `resource type "ImageFactorySchematics.runtime.talos.dev" is not supported`)

		_, err = cl.COSI.List(wCtx, resource.NewMetadata("nope", v1alpha1.ServiceType, "", resource.VersionUndefined))
		assert.Equal(t, codes.PermissionDenied, client.StatusCode(err))
		assert.ErrorContains(t, err, `namespace "nope" is not supported`)

		err = cl.COSI.Create(wCtx, runtime.NewVersion())
		assert.ErrorContains(t, err, "code = PermissionDenied desc = write access is not allowed")
	})

	t.Run("version, nodename, machine status", func(t *testing.T) {
		v, err := safe.StateGetByID[*runtime.Version](wCtx, cl.COSI, "version")
		require.NoError(t, err)
		assert.Equal(t, "v1.13.9", v.TypedSpec().Version)
		nn, err := safe.StateGetByID[*k8s.Nodename](wCtx, cl.COSI, k8s.NodenameID)
		require.NoError(t, err)
		assert.Equal(t, "w-1", nn.TypedSpec().Nodename)
		ms, err := safe.StateGetByID[*runtime.MachineStatus](wCtx, cl.COSI, runtime.MachineStatusID)
		require.NoError(t, err)
		assert.Equal(t, runtime.MachineStageRunning, ms.TypedSpec().Stage)
		assert.False(t, ms.TypedSpec().Status.Ready, "no kubelet has reported its Node")
	})

	t.Run("services listed and the kubelet restarted", func(t *testing.T) {
		resp, err := cl.ServiceList(cpCtx)
		require.NoError(t, err)
		require.Len(t, resp.GetMessages(), 1)
		var ids []string
		for _, s := range resp.GetMessages()[0].GetServices() {
			ids = append(ids, s.GetId())
			assert.Equal(t, "Running", s.GetState(), s.GetId())
		}
		assert.Equal(t, []string{"apid", "auditd", "containerd", "cri", "dashboard", "etcd", "kubelet", "machined", "syslogd", "trustd", "udevd"}, ids)

		list, err := safe.StateListAll[*v1alpha1.Service](cpCtx, cl.COSI)
		require.NoError(t, err)
		assert.Equal(t, len(ids), list.Len(), "one Service resource per running service")

		wctx, wcancel := context.WithCancel(cpCtx)
		defer wcancel()
		events := make(chan safe.WrappedStateEvent[*v1alpha1.Service], 16)
		require.NoError(t, safe.StateWatch(wctx, cl.COSI, v1alpha1.NewService("kubelet").Metadata(), events))
		recv := func(what string) safe.WrappedStateEvent[*v1alpha1.Service] {
			t.Helper()
			select {
			case ev := <-events:
				return ev
			case <-time.After(15 * time.Second):
				t.Fatalf("no event: %s", what)
				panic("unreachable")
			}
		}
		first := recv("initial")
		require.Equal(t, state.Created, first.Type())
		if r, err := first.Resource(); err == nil && !r.TypedSpec().Healthy {
			ev := recv("first health check")
			require.Equal(t, state.Updated, ev.Type())
		}

		_, err = cl.ServiceRestart(cpCtx, "kubelet")
		require.NoError(t, err)
		ev := recv("stopped")
		require.Equal(t, state.Destroyed, ev.Type())
		ev = recv("started")
		require.Equal(t, state.Created, ev.Type())
		r, err := ev.Resource()
		require.NoError(t, err)
		assert.Equal(t, v1alpha1.ServiceSpec{Running: true}, *r.TypedSpec(), "running, not healthy yet")
		ev = recv("healthy")
		require.Equal(t, state.Updated, ev.Type())
		r, err = ev.Resource()
		require.NoError(t, err)
		assert.Equal(t, v1alpha1.ServiceSpec{Running: true, Healthy: true}, *r.TypedSpec())

		_, err = cl.ServiceRestart(cpCtx, "etcd")
		assert.ErrorContains(t, err, `service "etcd" doesn't support restart operation via API`)
	})
}
