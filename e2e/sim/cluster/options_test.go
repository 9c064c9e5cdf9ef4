package cluster

import (
	"net"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestValidate(t *testing.T) {
	good := func() Options {
		return Options{Dir: t.TempDir(), ControlPlanes: 3, Workers: 2, KubernetesVersion: "v1.35.4", TalosVersion: "v1.13.9", BinDir: "/bin"}
	}
	for _, tc := range []struct {
		name   string
		mutate func(*Options)
		want   string
	}{
		{"ok", func(*Options) {}, ""},
		{"no dir", func(o *Options) { o.Dir = "" }, "--dir is required"},
		{"no control plane", func(o *Options) { o.ControlPlanes = 0 }, "at least 1 control plane"},
		{"negative workers", func(o *Options) { o.Workers = -1 }, "cannot be negative"},
		{"too many", func(o *Options) { o.Workers = maxMachines }, "at most"},
		{"kubernetes without v", func(o *Options) { o.KubernetesVersion = "1.35.4" }, "want a version like v1.35.4"},
		{"talos not a version", func(o *Options) { o.TalosVersion = "latest" }, "want a version like v1.12.4"},
		{"pairing", func(o *Options) { o.KubernetesVersion = "v1.37.0" }, "pick a pair that Talos supports"},
		{"no bin dir", func(o *Options) { o.BinDir = "" }, "make cluster-bins"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := good()
			tc.mutate(&o)
			err := o.Validate()
			if tc.want == "" {
				require.NoError(t, err)
				require.Equal(t, DefaultLatency(), o.Latency)
				require.Equal(t, "ichor-sim", o.Name)
				return
			}
			require.ErrorContains(t, err, tc.want)
		})
	}
}

func TestAddressPlan(t *testing.T) {
	p, err := pickAddresses(t.TempDir())
	require.NoError(t, err)
	b := p.base.As4()
	require.Equal(t, byte(127), b[0])
	require.Zero(t, b[2]%16, "a /20 block")
	require.Equal(t, p.offset(1), p.apiServer())
	require.Equal(t, p.offset(10), p.machine(0))
	// Machine addresses run on across octets without colliding.
	seen := map[string]bool{}
	for i := range 600 {
		a := p.machine(i).String()
		require.False(t, seen[a], a)
		seen[a] = true
	}

	// A taken block is skipped.
	l, err := net.Listen("tcp", p.apiServer().String()+":6443")
	require.NoError(t, err)
	defer l.Close()
	q, err := pickAddresses(t.TempDir())
	require.NoError(t, err)
	require.NotEqual(t, p.base, q.base)
}

func TestGeneratedConfigs(t *testing.T) {
	o := Options{Dir: t.TempDir(), ControlPlanes: 2, Workers: 1, KubernetesVersion: "v1.35.4", TalosVersion: "v1.13.9", BinDir: "/bin", TalosAPIAccess: true}
	require.NoError(t, o.Validate())
	p, err := pickAddresses(o.Dir)
	require.NoError(t, err)
	g, err := generateConfigs(o, p)
	require.NoError(t, err)
	require.Len(t, g.machines, 3)
	require.Equal(t, []string{"cp-1", "cp-2", "worker-1"}, []string{g.machines[0].Name, g.machines[1].Name, g.machines[2].Name})
	require.Contains(t, string(g.machines[0].Config), "hostname: cp-1")
	require.Contains(t, string(g.machines[0].Config), "registry.k8s.io/kube-apiserver:v1.35.4")
	require.Contains(t, string(g.machines[0].Config), "kubernetesTalosAPIAccess")
	require.Contains(t, string(g.machines[2].Config), "ghcr.io/siderolabs/kubelet:v1.35.4")
	require.NotContains(t, string(g.machines[2].Config), "kubernetesTalosAPIAccess", "only control planes serve it")
	require.Equal(t, []string{p.machine(0).String(), p.machine(1).String()}, g.talosconfig.Contexts[g.talosconfig.Context].Endpoints)
}
