package talosapi_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/siderolabs/talos/pkg/machinery/api/common"
	machineapi "github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/client"
	clientconfig "github.com/siderolabs/talos/pkg/machinery/client/config"
	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/generate"
	"github.com/siderolabs/talos/pkg/machinery/config/generate/secrets"
	"github.com/siderolabs/talos/pkg/machinery/config/machine"
	"github.com/siderolabs/talos/pkg/machinery/config/types/v1alpha1"
	configres "github.com/siderolabs/talos/pkg/machinery/resources/config"
	"github.com/siderolabs/talos/pkg/machinery/resources/k8s"
	"github.com/siderolabs/talos/pkg/machinery/role"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"

	"github.com/ichor-dev/kubectl-ichor/e2e/sim/faults"
	simmachine "github.com/ichor-dev/kubectl-ichor/e2e/sim/machine"
	"github.com/ichor-dev/kubectl-ichor/e2e/sim/talosapi"
	ichortalos "github.com/ichor-dev/kubectl-ichor/pkg/talos"
)

const newAPIServerImage = "registry.k8s.io/kube-apiserver:v1.36.3"

// installer1141 is Talos 1.14.1's default installer, the Image Factory's of
// the empty schematic: Talos 1.14 publishes no ghcr.io/siderolabs/installer.
const installer1141 = "factory.talos.dev/metal-installer/376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba:v1.14.1"

type cluster struct {
	bundle     *secrets.Bundle
	cpCfg      config.Provider
	cp, worker *simmachine.Machine
	cpIP, wIP  string
	// joining is cp-2, powered off from the start (newJoiningCluster only).
	joining   *simmachine.Machine
	talosconf string
	dir       string
	faults    string
}

// randomIPs returns n consecutive random loopback addresses whose API port
// is free, so parallel tests do not collide.
func randomIPs(t *testing.T, n int) []netip.Addr {
	t.Helper()
	for range 50 {
		base := [4]byte{127, byte(100 + rand.IntN(150)), byte(rand.IntN(256)), byte(2 + rand.IntN(200))}
		var ips []netip.Addr
		free := true
		for i := range n {
			ip := netip.AddrFrom4([4]byte{base[0], base[1], base[2], base[3] + byte(i)})
			l, err := net.Listen("tcp", net.JoinHostPort(ip.String(), "50000"))
			if err != nil {
				free = false
				break
			}
			_ = l.Close()
			ips = append(ips, ip)
		}
		if free {
			return ips
		}
	}
	t.Fatal("no free loopback addresses")
	return nil
}

func newCluster(t *testing.T) *cluster { return newClusterOf(t, false) }

// newJoiningCluster is newCluster with a second control plane, cp-2, powered
// off (the poweredOff fault) until the test clears the faults file.
func newJoiningCluster(t *testing.T) *cluster { return newClusterOf(t, true) }

func newClusterOf(t *testing.T, joining bool) *cluster {
	t.Helper()
	ctx := t.Context()
	ips := randomIPs(t, 3)
	c := &cluster{cpIP: ips[0].String(), wIP: ips[1].String(), dir: t.TempDir()}
	c.faults = filepath.Join(c.dir, "faults.yaml")
	if joining {
		require.NoError(t, os.WriteFile(c.faults, []byte("nodes:\n  cp-2:\n    poweredOff: true\n"), 0o644))
	}
	store, err := faults.Load(c.faults)
	require.NoError(t, err)

	c.bundle, err = secrets.NewBundle(secrets.NewFixedClock(time.Now()), config.TalosVersion1_13)
	require.NoError(t, err)
	in, err := generate.NewInput("sim", "https://"+c.cpIP+":6443", "1.35.2",
		generate.WithSecretsBundle(c.bundle),
		generate.WithVersionContract(config.TalosVersion1_13),
		generate.WithEndpointList([]string{c.cpIP}),
	)
	require.NoError(t, err)
	c.cpCfg, err = in.Config(machine.TypeControlPlane)
	require.NoError(t, err)
	wCfg, err := in.Config(machine.TypeWorker)
	require.NoError(t, err)

	newMachine := func(name string, ip netip.Addr, cp bool, version string, cfg config.Provider) *simmachine.Machine {
		b, err := cfg.Bytes()
		require.NoError(t, err)
		m, err := simmachine.New(simmachine.Options{
			Name: name, IP: ip, ControlPlane: cp, TalosVersion: version, Config: b,
			AdminKubeconfig: []byte("apiVersion: v1\nkind: Config\n"),
			Faults:          store,
			RebootDelay:     500 * time.Millisecond,
			PullLatency:     10 * time.Millisecond,
		})
		require.NoError(t, err)
		t.Cleanup(m.Close)
		return m
	}
	c.cp = newMachine("cp-1", ips[0], true, "v1.12.4", c.cpCfg)
	c.worker = newMachine("w-1", ips[1], false, "v1.13.9", wCfg)

	machines := []*simmachine.Machine{c.cp, c.worker}
	if joining {
		c.joining = newMachine("cp-2", ips[2], true, "v1.12.4", c.cpCfg)
		machines = append(machines, c.joining)
	}

	srv, err := talosapi.Start(ctx, talosapi.Options{
		Machines: machines,
		CACert:   c.bundle.Certs.OS.Crt,
		CAKey:    c.bundle.Certs.OS.Key,
	})
	require.NoError(t, err)
	t.Cleanup(srv.Stop)

	tc, err := in.Talosconfig()
	require.NoError(t, err)
	tc.Contexts[tc.Context].Endpoints = []string{c.cpIP}
	c.talosconf = filepath.Join(c.dir, "talosconfig")
	require.NoError(t, tc.Save(c.talosconf))
	return c
}

func (c *cluster) client(t *testing.T, path string) *client.Client {
	t.Helper()
	cl, err := client.New(t.Context(), client.WithConfigFromFile(path))
	require.NoError(t, err)
	t.Cleanup(func() { _ = cl.Close() })
	return cl
}

// readerConfig writes a talosconfig whose client certificate has os:reader.
func (c *cluster) readerConfig(t *testing.T) string {
	t.Helper()
	crt, err := c.bundle.GenerateTalosAPIClientCertificate(role.MakeSet(role.Reader))
	require.NoError(t, err)
	tc := clientconfig.NewConfig("reader", []string{c.cpIP}, c.bundle.Certs.OS.Crt, crt)
	path := filepath.Join(c.dir, "talosconfig-reader")
	require.NoError(t, tc.Save(path))
	return path
}

func TestTalosAPI(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	cl := c.client(t, c.talosconf)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()

	t.Run("version routed to the second machine", func(t *testing.T) {
		for _, node := range []string{c.wIP, "w-1"} {
			resp, err := cl.Version(client.WithNode(ctx, node))
			require.NoError(t, err)
			require.Len(t, resp.GetMessages(), 1)
			assert.Equal(t, "v1.13.9", resp.GetMessages()[0].GetVersion().GetTag())
			assert.Equal(t, node, resp.GetMessages()[0].GetMetadata().GetHostname())
		}
		resp, err := cl.Version(ctx)
		require.NoError(t, err)
		assert.Equal(t, "v1.12.4", resp.GetMessages()[0].GetVersion().GetTag(), "no node: the receiving endpoint")

		resp, err = cl.Version(client.WithNodes(ctx, c.cpIP, c.wIP))
		require.NoError(t, err)
		require.Len(t, resp.GetMessages(), 2)
		assert.Equal(t, "v1.12.4", resp.GetMessages()[0].GetVersion().GetTag())
		assert.Equal(t, "v1.13.9", resp.GetMessages()[1].GetVersion().GetTag())

		_, err = cl.Version(client.WithNode(ctx, "nope"))
		assert.Equal(t, codes.NotFound, client.StatusCode(err))
	})

	t.Run("dry run then apply, seen by COSI Get and Watch", func(t *testing.T) {
		nctx := client.WithNode(ctx, c.cpIP)
		mc, err := safe.StateGetByID[*configres.MachineConfig](nctx, cl.COSI, configres.ActiveID)
		require.NoError(t, err)
		assert.Equal(t, c.cpCfg.K8sAPIServerConfig().Image(), mc.Config().K8sAPIServerConfig().Image())

		wctx, wcancel := context.WithCancel(nctx)
		defer wcancel()
		events := make(chan safe.WrappedStateEvent[*configres.MachineConfig], 16)
		require.NoError(t, safe.StateWatch(wctx, cl.COSI,
			resource.NewMetadata(configres.NamespaceName, configres.MachineConfigType, configres.ActiveID, resource.VersionUndefined), events))
		first := <-events
		require.Equal(t, state.Created, first.Type())

		patched, err := c.cpCfg.PatchV1Alpha1(func(cfg *v1alpha1.Config) error {
			cfg.ClusterConfig.APIServerConfig.ContainerImage = newAPIServerImage
			return nil
		})
		require.NoError(t, err)
		data, err := patched.Bytes()
		require.NoError(t, err)

		dry, err := cl.ApplyConfiguration(nctx, &machineapi.ApplyConfigurationRequest{
			Data: data, Mode: machineapi.ApplyConfigurationRequest_NO_REBOOT, DryRun: true,
		})
		require.NoError(t, err)
		assert.Contains(t, dry.GetMessages()[0].GetModeDetails(), newAPIServerImage)
		api, err := safe.StateGetByID[*k8s.APIServerConfig](nctx, cl.COSI, k8s.APIServerConfigID)
		require.NoError(t, err)
		assert.Equal(t, c.cpCfg.K8sAPIServerConfig().Image(), api.TypedSpec().Image, "dry run changes nothing")

		resp, err := cl.ApplyConfiguration(nctx, &machineapi.ApplyConfigurationRequest{
			Data: data, Mode: machineapi.ApplyConfigurationRequest_NO_REBOOT,
		})
		require.NoError(t, err)
		assert.Equal(t, machineapi.ApplyConfigurationRequest_NO_REBOOT, resp.GetMessages()[0].GetMode())
		assert.Equal(t, c.cpIP, resp.GetMessages()[0].GetMetadata().GetHostname())

		api, err = safe.StateGetByID[*k8s.APIServerConfig](nctx, cl.COSI, k8s.APIServerConfigID)
		require.NoError(t, err)
		assert.Equal(t, newAPIServerImage, api.TypedSpec().Image)
		sp, err := safe.StateGetByID[*k8s.StaticPod](nctx, cl.COSI, k8s.APIServerID)
		require.NoError(t, err)
		ann := sp.TypedSpec().Pod["metadata"].(map[string]any)["annotations"].(map[string]any)
		assert.Equal(t, api.Metadata().Version().String(), ann["talos.dev/config-version"])

		select {
		case ev := <-events:
			require.Equal(t, state.Updated, ev.Type())
			r, err := ev.Resource()
			require.NoError(t, err)
			assert.Equal(t, newAPIServerImage, r.Config().K8sAPIServerConfig().Image())
		case <-time.After(10 * time.Second):
			t.Fatal("no watch event after apply")
		}
	})

	t.Run("image pull", func(t *testing.T) {
		for _, ns := range []common.ContainerdNamespace{common.ContainerdNamespace_NS_CRI, common.ContainerdNamespace_NS_SYSTEM} {
			stream, err := cl.ImageClient.Pull(client.WithNode(ctx, c.wIP), &machineapi.ImageServicePullRequest{
				Containerd: &common.ContainerdInstance{Driver: common.ContainerDriver_CRI, Namespace: ns},
				ImageRef:   "registry.k8s.io/kube-proxy:v1.36.3",
			})
			require.NoError(t, err)
			var name string
			for {
				msg, err := stream.Recv()
				if errors.Is(err, io.EOF) {
					break
				}
				require.NoError(t, err)
				if n := msg.GetName(); n != "" {
					name = n
				}
			}
			assert.Equal(t, "registry.k8s.io/kube-proxy:v1.36.3", name)
		}
		err := cl.ImagePull(client.WithNode(ctx, c.wIP), common.ContainerdNamespace_NS_CRI, "registry.k8s.io/pause:3.10")
		require.NoError(t, err)
	})

	t.Run("etcd members, kubeconfig, boot id", func(t *testing.T) {
		members, err := cl.EtcdMemberList(ctx, &machineapi.EtcdMemberListRequest{QueryLocal: true})
		require.NoError(t, err)
		require.Len(t, members.GetMessages()[0].GetMembers(), 1)
		assert.Equal(t, "cp-1", members.GetMessages()[0].GetMembers()[0].GetHostname())
		assert.False(t, members.GetMessages()[0].GetMembers()[0].GetIsLearner())

		kc, err := cl.Kubeconfig(ctx)
		require.NoError(t, err)
		assert.Contains(t, string(kc), "kind: Config")

		assert.Equal(t, c.worker.State().BootID, readBootID(t, cl, client.WithNode(ctx, "w-1")))
	})

	t.Run("reader role", func(t *testing.T) {
		reader := c.client(t, c.readerConfig(t))
		_, err := reader.Version(ctx)
		require.NoError(t, err)
		_, err = safe.StateGetByID[*k8s.ControllerManagerConfig](ctx, reader.COSI, k8s.ControllerManagerConfigID)
		require.NoError(t, err, "non-sensitive resources are readable")

		b, err := c.cpCfg.Bytes()
		require.NoError(t, err)
		_, err = reader.ApplyConfiguration(ctx, &machineapi.ApplyConfigurationRequest{Data: b, Mode: machineapi.ApplyConfigurationRequest_NO_REBOOT})
		assert.Equal(t, codes.PermissionDenied, client.StatusCode(err))
		_, err = safe.StateGetByID[*configres.MachineConfig](ctx, reader.COSI, configres.ActiveID)
		assert.Equal(t, codes.PermissionDenied, client.StatusCode(err), "sensitive resources need os:admin")
		err = reader.Reboot(ctx)
		assert.Equal(t, codes.PermissionDenied, client.StatusCode(err))
	})

	t.Run("services by the target's version", func(t *testing.T) {
		// cp-1 runs v1.12.4: no LifecycleService, no ImageService, whichever
		// endpoint proxies the call (w-1 runs v1.13.9).
		for _, via := range []*client.Client{cl, c.clientVia(t, c.wIP)} {
			nctx := client.WithNode(ctx, c.cpIP)
			up, err := via.LifecycleClient.Upgrade(nctx, &machineapi.LifecycleServiceUpgradeRequest{
				Containerd: &common.ContainerdInstance{Driver: common.ContainerDriver_CONTAINERD, Namespace: common.ContainerdNamespace_NS_SYSTEM},
				Source:     &machineapi.InstallArtifactsSource{ImageName: "ghcr.io/siderolabs/installer:v1.13.9"},
			})
			if err == nil {
				_, err = up.Recv()
			}
			assert.Equal(t, codes.Unimplemented, client.StatusCode(err), "%v", err)
			assert.ErrorContains(t, err, "unknown service machine.LifecycleService")

			pull, err := via.ImageClient.Pull(nctx, &machineapi.ImageServicePullRequest{
				Containerd: &common.ContainerdInstance{Driver: common.ContainerDriver_CRI, Namespace: common.ContainerdNamespace_NS_CRI},
				ImageRef:   "registry.k8s.io/kube-proxy:v1.36.3",
			})
			if err == nil {
				_, err = pull.Recv()
			}
			assert.Equal(t, codes.Unimplemented, client.StatusCode(err), "%v", err)
			assert.ErrorContains(t, err, "unknown service machine.ImageService")
		}
		assert.Empty(t, c.cp.State().StagedVersion, "nothing installed")
	})

	t.Run("lifecycle install on Talos 1.13", func(t *testing.T) {
		nctx := client.WithNode(ctx, c.wIP)
		system := &common.ContainerdInstance{Driver: common.ContainerDriver_CRI, Namespace: common.ContainerdNamespace_NS_SYSTEM}
		// The installer is pulled first (talosctl upgrade does): the lifecycle
		// service installs only what the store holds.
		pull, err := cl.ImageClient.Pull(nctx, &machineapi.ImageServicePullRequest{Containerd: system, ImageRef: installer1141})
		require.NoError(t, err)
		for {
			if _, err := pull.Recv(); err != nil {
				require.ErrorIs(t, err, io.EOF)
				break
			}
		}
		stream, err := cl.LifecycleClient.Upgrade(nctx, &machineapi.LifecycleServiceUpgradeRequest{
			Containerd: &common.ContainerdInstance{Driver: common.ContainerDriver_CONTAINERD, Namespace: common.ContainerdNamespace_NS_SYSTEM},
			Source:     &machineapi.InstallArtifactsSource{ImageName: installer1141},
		})
		require.NoError(t, err)
		exit := int32(-1)
		for {
			msg, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			require.NoError(t, err)
			if ec, ok := msg.GetProgress().GetResponse().(*machineapi.LifecycleServiceInstallProgress_ExitCode); ok {
				exit = ec.ExitCode
			}
		}
		assert.Equal(t, int32(0), exit)
		assert.Equal(t, "v1.14.1", c.worker.State().StagedVersion, "installed, for the next reboot")

		// machined's log says the install ran and ended, as talosctl logs
		// machined reads it: what tells a staged upgrade on Talos.
		evidence, err := ichortalos.ParseInstallEvidence(strings.NewReader(machinedLog(t, cl, nctx)))
		require.NoError(t, err)
		assert.Equal(t, ichortalos.InstallDone.String(), evidence.State.String())
	})

	t.Run("legacy upgrade of the routed node on Talos 1.12: it reboots by itself", func(t *testing.T) {
		before := readBootID(t, cl, client.WithNode(ctx, c.cpIP))

		// Talk to the control plane through the worker's endpoint so the
		// client survives the control plane's listener going away.
		wcl := c.clientVia(t, c.wIP)
		wctx := client.WithNode(ctx, c.cpIP)
		watchCtx, watchCancel := context.WithCancel(wctx)
		defer watchCancel()
		watchEvents := make(chan state.Event, 16)
		require.NoError(t, wcl.COSI.Watch(watchCtx,
			resource.NewMetadata(k8s.NamespaceName, k8s.NodenameType, k8s.NodenameID, resource.VersionUndefined), watchEvents))
		require.Equal(t, state.Created, (<-watchEvents).Type)
		resp, err := wcl.UpgradeWithOptions(wctx, client.WithUpgradeImage("ghcr.io/siderolabs/installer:v1.13.9")) //nolint:staticcheck // the call of Talos 1.12
		require.NoError(t, err)
		assert.Equal(t, "Upgrade request received", resp.GetMessages()[0].GetAck(), "an ack at once; the sequence runs in the background")

		require.Eventually(t, func() bool {
			conn, err := net.DialTimeout("tcp", net.JoinHostPort(c.cpIP, "50000"), time.Second)
			if err != nil {
				return true
			}
			_ = conn.Close()
			return false
		}, 5*time.Second, 20*time.Millisecond, "the rebooting node refuses connections")
		_, err = wcl.Version(wctx)
		assert.Equal(t, codes.Unavailable, client.StatusCode(err), "routed to a rebooting node")
		select {
		case ev := <-watchEvents:
			require.Equal(t, state.Errored, ev.Type, "a routed watch breaks when its node goes down")
			assert.Equal(t, codes.Unavailable, client.StatusCode(ev.Error))
		case <-time.After(5 * time.Second):
			t.Fatal("routed watch did not end")
		}

		require.Eventually(t, func() bool {
			resp, err := wcl.Version(wctx)
			return err == nil && resp.GetMessages()[0].GetVersion().GetTag() == "v1.13.9"
		}, 10*time.Second, 50*time.Millisecond)
		assert.NotEqual(t, before, readBootID(t, wcl, wctx))

		evidence, err := ichortalos.ParseInstallEvidence(strings.NewReader(machinedLog(t, wcl, wctx)))
		require.NoError(t, err)
		assert.Equal(t, ichortalos.InstallNone.String(), evidence.String(), "a new boot, a new log")
	})
}

// machinedLog reads machined's log as talosctl logs machined does.
func machinedLog(t *testing.T, cl *client.Client, ctx context.Context) string { //nolint:revive // test helper
	t.Helper()
	stream, err := cl.Logs(ctx, "system", common.ContainerDriver_CONTAINERD, "machined", false, -1)
	require.NoError(t, err)
	r, err := client.ReadStream(stream)
	require.NoError(t, err)
	defer r.Close() //nolint:errcheck
	b, err := io.ReadAll(r)
	require.NoError(t, err)
	return string(b)
}

// TestLogSlowAndRollback: under logSlow machined's log answers only after
// that long (a caller with a shorter deadline gets none); Rollback drops an
// install staged in this boot and reboots the node into the version it runs.
func TestLogSlowAndRollback(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	cl := c.client(t, c.talosconf)
	ctx := client.WithNode(t.Context(), c.wIP)

	require.NoError(t, os.WriteFile(c.faults, []byte("nodes:\n  w-1:\n    logSlow: 2s\n"), 0o644))

	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()

	stream, err := cl.Logs(short, "system", common.ContainerDriver_CONTAINERD, "machined", false, -1)
	if err == nil {
		var r io.ReadCloser
		if r, err = client.ReadStream(stream); err == nil {
			var b []byte
			b, err = io.ReadAll(r)
			_ = r.Close()
			if err == nil && len(b) == 0 {
				err = short.Err()
			}
		}
	}
	require.Error(t, err, "no log within 300ms")

	start := time.Now()
	assert.Contains(t, machinedLog(t, cl, ctx), "machined logger initialized")
	assert.GreaterOrEqual(t, time.Since(start), 2*time.Second, "the log came after the fault's delay")

	require.NoError(t, os.WriteFile(c.faults, []byte("nodes: {}\n"), 0o644))

	const image = "factory.talos.dev/metal-installer/376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba:v1.14.1"

	before := readBootID(t, cl, ctx)
	// The installer is pulled first, as a client does: the lifecycle service
	// installs only what the store holds.
	pull, err := cl.ImageClient.Pull(ctx, &machineapi.ImageServicePullRequest{
		Containerd: &common.ContainerdInstance{Driver: common.ContainerDriver_CONTAINERD, Namespace: common.ContainerdNamespace_NS_SYSTEM},
		ImageRef:   image,
	})
	require.NoError(t, err)
	for {
		if _, err := pull.Recv(); err != nil {
			require.ErrorIs(t, err, io.EOF)
			break
		}
	}
	up, err := cl.LifecycleClient.Upgrade(ctx, &machineapi.LifecycleServiceUpgradeRequest{
		Containerd: &common.ContainerdInstance{Driver: common.ContainerDriver_CONTAINERD, Namespace: common.ContainerdNamespace_NS_SYSTEM},
		Source:     &machineapi.InstallArtifactsSource{ImageName: image},
	})
	require.NoError(t, err)
	for {
		if _, err := up.Recv(); err != nil {
			require.ErrorIs(t, err, io.EOF)
			break
		}
	}
	require.Equal(t, "v1.14.1", c.worker.State().StagedVersion)

	require.NoError(t, cl.Rollback(ctx))
	require.Eventually(t, func() bool {
		s := c.worker.State()
		return s.Up && s.BootID != before
	}, 10*time.Second, 50*time.Millisecond, "rebooted")
	s := c.worker.State()
	assert.Equal(t, "v1.13.9", s.TalosVersion, "back on the version it ran")
	assert.Empty(t, s.StagedVersion, "the staged install dropped")
}

// clientVia returns an admin client whose only endpoint is ip.
func (c *cluster) clientVia(t *testing.T, ip string) *client.Client {
	t.Helper()
	tc, err := clientconfig.Open(c.talosconf)
	require.NoError(t, err)
	tc.Contexts[tc.Context].Endpoints = []string{ip}
	path := filepath.Join(c.dir, fmt.Sprintf("talosconfig-%s", strings.ReplaceAll(ip, ".", "-")))
	require.NoError(t, tc.Save(path))
	return c.client(t, path)
}

func readBootID(t *testing.T, cl *client.Client, ctx context.Context) string { //nolint:revive // test helper
	t.Helper()
	r, err := cl.Read(ctx, "/proc/sys/kernel/random/boot_id")
	require.NoError(t, err)
	defer r.Close() //nolint:errcheck
	b, err := io.ReadAll(r)
	require.NoError(t, err)
	return strings.TrimSpace(string(b))
}

func TestUnreachableFaultClosesListener(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	wcl := c.clientVia(t, c.cpIP)
	dial := func() error {
		conn, err := net.DialTimeout("tcp", net.JoinHostPort(c.wIP, "50000"), time.Second)
		if err == nil {
			_ = conn.Close()
		}
		return err
	}
	require.NoError(t, dial())
	require.NoError(t, os.WriteFile(c.faults, []byte("nodes:\n  w-1:\n    unreachable: true\n"), 0o644))
	require.Eventually(t, func() bool { return dial() != nil }, 5*time.Second, 20*time.Millisecond)
	_, err := wcl.Version(client.WithNode(t.Context(), "w-1"))
	assert.Equal(t, codes.Unavailable, client.StatusCode(err))

	require.NoError(t, os.WriteFile(c.faults, []byte("nodes: {}\n"), 0o644))
	require.Eventually(t, func() bool { return dial() == nil }, 5*time.Second, 20*time.Millisecond)
	resp, err := c.clientVia(t, c.wIP).Version(t.Context())
	require.NoError(t, err)
	assert.Equal(t, "v1.13.9", resp.GetMessages()[0].GetVersion().GetTag())
}

// TestLegacyUpgradeFaults: MachineService.Upgrade runs Talos' etcd checks on
// a control plane (force skips them), and under upgradeUnavailable answers
// Unavailable although its sequence started: the node reboots by itself.
func TestLegacyUpgradeFaults(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	cl := c.clientVia(t, c.wIP)
	ctx := t.Context()
	upgrade := func(ip string, opts ...client.UpgradeOption) error {
		opts = append([]client.UpgradeOption{client.WithUpgradeImage("ghcr.io/siderolabs/installer:v1.13.9")}, opts...)
		_, err := cl.UpgradeWithOptions(client.WithNode(ctx, ip), opts...) //nolint:staticcheck // the call of Talos 1.12
		return err
	}

	require.NoError(t, os.WriteFile(c.faults, []byte("nodes:\n  cp-1:\n    etcdStopped: true\n"), 0o644))
	err := upgrade(c.cpIP)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "error validating etcd for upgrade: etcd member")
	assert.Contains(t, err.Error(), "is not healthy; all members must be healthy to perform an upgrade")
	assert.Empty(t, c.cp.State().StagedVersion, "nothing installed")

	require.NoError(t, os.WriteFile(c.faults, []byte("nodes:\n  cp-1:\n    etcdStopped: true\n  w-1:\n    upgradeUnavailable: true\n"), 0o644))
	err = upgrade(c.wIP, client.WithUpgradeImage(installer1141))
	assert.Equal(t, codes.Unavailable, client.StatusCode(err), "%v", err)
	require.Eventually(t, func() bool { s := c.worker.State(); return s.Up && s.TalosVersion == "v1.14.1" },
		10*time.Second, 20*time.Millisecond, "the sequence ran all the same")
	// The calls go through w-1's apid, which answers again a moment after the
	// machine is up (failed in CI when called at once).
	require.Eventually(t, func() bool {
		_, err := cl.Version(client.WithNode(ctx, c.cpIP))
		return err == nil
	}, 10*time.Second, 20*time.Millisecond, "w-1's apid answers after its reboot")

	require.NoError(t, upgrade(c.cpIP, client.WithUpgradeForce(true)), "force skips the etcd checks")
	require.Eventually(t, func() bool { s := c.cp.State(); return s.Up && s.TalosVersion == "v1.13.9" },
		10*time.Second, 20*time.Millisecond)
}
