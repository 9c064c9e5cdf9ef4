package stages_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery/discoverytest"
	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
	"github.com/ichor-dev/kubectl-ichor/pkg/talos"
)

const (
	schematicA = "5a8a2c5d1c6e3b4f7a9d0e1f2a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d"
	schematicB = "376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba"
)

// factoryExt is Image Factory's virtual schematic extension as Talos reports it.
func factoryExt(id string) talos.Extension {
	return talos.Extension{Name: "schematic", Version: id, Author: "Image Factory (https://factory.talos.dev)"}
}

var (
	iscsi = talos.Extension{Name: "iscsi-tools", Version: "v0.2.0", Author: "Sidero Labs"}
	drbd  = talos.Extension{Name: "drbd", Version: "9.2.14-v1.14.1", Author: "Sidero Labs"}
)

func TestChooseInstaller(t *testing.T) {
	plain := "ghcr.io/siderolabs/installer:v1.13.9"
	empty114 := "factory.talos.dev/metal-installer/" + stages.EmptySchematic + ":v1.14.1"
	withSchematic := &talos.Installed{Platform: "metal", Extensions: []talos.Extension{iscsi, drbd, factoryExt(schematicA)}}
	all := func(image string) stages.InstallerFlags { return stages.InstallerFlags{Image: image} }
	dropping := func(image string) stages.InstallerFlags {
		return stages.InstallerFlags{Image: image, DropExtensions: []string{"cp-1"}}
	}

	tests := []struct {
		name       string
		target     string // v1.14.1 unless set
		configured string
		installed  *talos.Installed
		flags      stages.InstallerFlags
		want       string
		source     string
		expect     stages.InstallExpect
		drops      []string
		wantErr    string
	}{
		// Talos 1.14 publishes no generic installer: Talos' default instead.
		{
			name: "1.14, no extensions, the generic installer configured: the factory installer of the empty schematic", configured: plain,
			installed: &talos.Installed{Platform: "metal"},
			want:      empty114, source: stages.InstallerDefault, expect: stages.InstallExpect{Schematic: stages.EmptySchematic},
		},
		{
			name: "1.14, no extensions, nothing configured: the same", installed: &talos.Installed{Platform: "metal"},
			want: empty114, source: stages.InstallerDefault, expect: stages.InstallExpect{Schematic: stages.EmptySchematic},
		},
		{
			name: "1.14 on aws with SecureBoot: that platform's secureboot installer of the empty schematic", configured: plain,
			installed: &talos.Installed{Platform: "aws", SecureBoot: true},
			want:      "factory.talos.dev/aws-installer-secureboot/" + stages.EmptySchematic + ":v1.14.1", source: stages.InstallerDefault,
			expect: stages.InstallExpect{Schematic: stages.EmptySchematic},
		},
		{
			name:       "1.14, a mirror of the generic installer: refused, naming the factory installer to mirror and the flag",
			configured: "registry.local:5000/siderolabs/installer:v1.13.9", installed: &talos.Installed{Platform: "metal"},
			wantErr: `node "cp-1": its config names registry.local:5000/siderolabs/installer, a mirror of ghcr.io/siderolabs/installer, which Talos 1.14 no longer publishes: ` +
				`mirror ` + empty114 + ` and pass it with --installer-image cp-1=<your mirror of it>`,
		},
		{
			name: "1.14, another installer configured (built with imager): kept, tag moved", configured: "registry.local/talos/custom-installer:v1.13.9",
			installed: &talos.Installed{Platform: "metal"},
			want:      "registry.local/talos/custom-installer:v1.14.1", source: stages.InstallerConfigured,
		},
		// Below 1.14 the generic installer stays.
		{
			name: "1.13, no extensions: the configured installer at the target", target: "v1.13.9", configured: "ghcr.io/siderolabs/installer:v1.12.4",
			installed: &talos.Installed{Platform: "metal"},
			want:      "ghcr.io/siderolabs/installer:v1.13.9", source: stages.InstallerConfigured,
		},
		{
			name: "1.13, a mirror, no extensions: its repository kept", target: "v1.13.9", configured: "registry.local:5000/siderolabs/installer:v1.12.4",
			installed: &talos.Installed{Platform: "metal"},
			want:      "registry.local:5000/siderolabs/installer:v1.13.9", source: stages.InstallerConfigured,
		},
		{
			name: "1.13, nothing configured: Talos 1.13's default, the generic installer", target: "v1.13.9", installed: &talos.Installed{Platform: "metal"},
			want: "ghcr.io/siderolabs/installer:v1.13.9", source: stages.InstallerConfigured,
		},
		// A schematic is kept.
		{
			name:       "schematic with extensions, plain installer configured: the factory installer of the schematic",
			configured: plain, installed: withSchematic,
			want: "factory.talos.dev/metal-installer/" + schematicA + ":v1.14.1", source: stages.InstallerSchematic,
			expect: stages.InstallExpect{Schematic: schematicA, Extensions: []string{"iscsi-tools", "drbd"}},
		},
		{
			name:       "schematic on aws with SecureBoot: that platform's secureboot installer",
			configured: plain, installed: &talos.Installed{Platform: "aws", SecureBoot: true, Extensions: []talos.Extension{factoryExt(schematicA), iscsi}},
			want: "factory.talos.dev/aws-installer-secureboot/" + schematicA + ":v1.14.1", source: stages.InstallerSchematic,
			expect: stages.InstallExpect{Schematic: schematicA, Extensions: []string{"iscsi-tools"}},
		},
		{
			name: "self-hosted factory: its host from the extension's author", configured: plain,
			installed: &talos.Installed{Platform: "metal", Extensions: []talos.Extension{
				{Name: "schematic", Version: schematicA, Author: "Image Factory (https://factory.example.com/)"}, iscsi,
			}},
			want: "factory.example.com/metal-installer/" + schematicA + ":v1.14.1", source: stages.InstallerSchematic,
			expect: stages.InstallExpect{Schematic: schematicA, Extensions: []string{"iscsi-tools"}},
		},
		{
			name:       "the configured legacy factory installer of the same schematic: kept, tag moved",
			configured: "factory.talos.dev/installer/" + schematicA + ":v1.13.9",
			installed:  &talos.Installed{Platform: "metal", Extensions: []talos.Extension{iscsi, factoryExt(schematicA)}},
			want:       "factory.talos.dev/installer/" + schematicA + ":v1.14.1", source: stages.InstallerConfigured,
			expect: stages.InstallExpect{Schematic: schematicA, Extensions: []string{"iscsi-tools"}},
		},
		{
			name:       "a mirror of the factory installer of the same schematic: kept",
			configured: "registry.local/factory/metal-installer-secureboot/" + schematicA + ":v1.13.9",
			installed:  &talos.Installed{Platform: "metal", SecureBoot: true, Extensions: []talos.Extension{factoryExt(schematicA)}},
			want:       "registry.local/factory/metal-installer-secureboot/" + schematicA + ":v1.14.1", source: stages.InstallerConfigured,
			expect: stages.InstallExpect{Schematic: schematicA},
		},
		{
			name:       "the default schematic, no extension: still its factory installer (kernel args, overlay)",
			configured: plain, installed: &talos.Installed{Platform: "metal", Extensions: []talos.Extension{factoryExt(schematicB)}},
			want: "factory.talos.dev/metal-installer/" + schematicB + ":v1.14.1", source: stages.InstallerSchematic,
			expect: stages.InstallExpect{Schematic: schematicB},
		},
		// An explicit installer, checked against what the node runs.
		{
			name: "--installer-image for a node without extensions: taken", configured: plain, flags: all("my.registry/installer:v1.14.1"),
			installed: &talos.Installed{Platform: "metal"},
			want:      "my.registry/installer:v1.14.1", source: stages.InstallerFlag,
		},
		{
			name: "--installer-image without anything read", flags: all("my.registry/installer:v1.14.1"),
			want: "my.registry/installer:v1.14.1", source: stages.InstallerFlag,
		},
		{
			name: "--installer-image of the node's schematic: taken, its extensions expected back", configured: plain,
			flags: all("registry.local/metal-installer/" + schematicA + ":v1.14.1"), installed: withSchematic,
			want: "registry.local/metal-installer/" + schematicA + ":v1.14.1", source: stages.InstallerFlag,
			expect: stages.InstallExpect{Schematic: schematicA, Extensions: []string{"iscsi-tools", "drbd"}},
		},
		{
			name: "--installer-image of another schematic: refused", configured: plain,
			flags: all("factory.talos.dev/metal-installer/" + schematicB + ":v1.14.1"), installed: withSchematic,
			wantErr: `node "cp-1" runs schematic 5a8a2c5d1c6e, iscsi-tools, drbd, which --installer-image factory.talos.dev/metal-installer/` + schematicB + `:v1.14.1 does not carry: ` +
				`the node would reboot without them: pass one that does (--installer-image cp-1=factory.talos.dev/metal-installer/` + schematicA + `:v1.14.1), or accept losing them with --drop-extensions cp-1`,
		},
		{
			name: "--installer-image of another schematic, --drop-extensions: taken, what is dropped said", configured: plain,
			flags: dropping("factory.talos.dev/metal-installer/" + schematicB + ":v1.14.1"), installed: withSchematic,
			want: "factory.talos.dev/metal-installer/" + schematicB + ":v1.14.1", source: stages.InstallerFlag,
			expect: stages.InstallExpect{Schematic: schematicB}, drops: []string{"schematic 5a8a2c5d1c6e", "iscsi-tools", "drbd"},
		},
		{
			name: "the generic installer for a node on a schematic: refused", target: "v1.13.9", configured: plain,
			flags: all("ghcr.io/siderolabs/installer:v1.13.9"), installed: withSchematic,
			wantErr: `node "cp-1" runs schematic 5a8a2c5d1c6e, iscsi-tools, drbd, which --installer-image ghcr.io/siderolabs/installer:v1.13.9 does not carry: ` +
				`the node would reboot without them: pass one that does (--installer-image cp-1=factory.talos.dev/metal-installer/` + schematicA + `:v1.13.9), or accept losing them with --drop-extensions cp-1`,
		},
		{
			name: "the generic installer for extensions without a schematic: refused", target: "v1.13.9", configured: plain,
			flags: all("ghcr.io/siderolabs/installer:v1.13.9"), installed: &talos.Installed{Platform: "metal", Extensions: []talos.Extension{iscsi}},
			wantErr: `node "cp-1" runs iscsi-tools, which --installer-image ghcr.io/siderolabs/installer:v1.13.9 does not carry: ` +
				`the node would reboot without them: pass one that does (--installer-image cp-1=REPOSITORY:v1.13.9), or accept losing them with --drop-extensions cp-1`,
		},
		{
			name: "an installer built with imager for extensions without a schematic: taken, the extensions expected back", configured: plain,
			flags: all("my.registry/installer:v1.14.1"), installed: &talos.Installed{Platform: "metal", Extensions: []talos.Extension{iscsi}},
			want: "my.registry/installer:v1.14.1", source: stages.InstallerFlag, expect: stages.InstallExpect{Extensions: []string{"iscsi-tools"}},
		},
		{
			name: "any installer for a node on the empty schematic alone: nothing to lose", configured: plain,
			flags: all("my.registry/installer:v1.14.1"), installed: &talos.Installed{Platform: "metal", Extensions: []talos.Extension{factoryExt(schematicB)}},
			want: "my.registry/installer:v1.14.1", source: stages.InstallerFlag,
		},
		{
			name: "a node's own --installer-image wins over the one for every node", configured: plain, installed: withSchematic,
			flags: stages.InstallerFlags{Image: "ghcr.io/siderolabs/installer:v1.14.1", Nodes: map[string]string{"cp-1": "factory.talos.dev/metal-installer/" + schematicA + ":v1.14.1"}},
			want:  "factory.talos.dev/metal-installer/" + schematicA + ":v1.14.1", source: stages.InstallerFlag,
			expect: stages.InstallExpect{Schematic: schematicA, Extensions: []string{"iscsi-tools", "drbd"}},
		},
		{
			name: "another node's --drop-extensions does not cover this one", configured: plain, installed: withSchematic,
			flags:   stages.InstallerFlags{Image: "ghcr.io/siderolabs/installer:v1.13.9", DropExtensions: []string{"worker-1"}},
			target:  "v1.13.9",
			wantErr: `or accept losing them with --drop-extensions cp-1`,
		},
		// What cannot be derived is refused, naming the flag.
		{
			name: "extensions without a schematic: refused", configured: plain,
			installed: &talos.Installed{Platform: "metal", Extensions: []talos.Extension{iscsi, drbd}},
			wantErr:   `node "cp-1" runs system extensions (iscsi-tools, drbd) but no Image Factory schematic: the installer that keeps them cannot be derived: pass it with --installer-image cp-1=REPOSITORY:v1.14.1`,
		},
		{
			name: "the configured factory installer of another schematic: refused", configured: "factory.talos.dev/metal-installer/" + schematicB + ":v1.13.9",
			installed: &talos.Installed{Platform: "metal", Extensions: []talos.Extension{iscsi, factoryExt(schematicA)}},
			wantErr: `node "cp-1" runs schematic 5a8a2c5d1c6e but its config names the installer of schematic 376567988ad3 (factory.talos.dev/metal-installer/` + schematicB + `:v1.13.9): ` +
				`pass the one to install with --installer-image, e.g. --installer-image cp-1=factory.talos.dev/metal-installer/` + schematicA + `:v1.14.1`,
		},
		{
			name: "a schematic whose factory is not named: refused", configured: plain,
			installed: &talos.Installed{Platform: "metal", Extensions: []talos.Extension{{Name: "schematic", Version: schematicA, Author: "Image Factory"}}},
			wantErr:   `node "cp-1" runs schematic 5a8a2c5d1c6e but its Image Factory is not named (extension author "Image Factory"): pass the installer with --installer-image cp-1=<factory>/installer/` + schematicA + `:v1.14.1`,
		},
		{
			name: "a schematic version that is no ID: refused", configured: plain,
			installed: &talos.Installed{Platform: "metal", Extensions: []talos.Extension{factoryExt("")}},
			wantErr:   `node "cp-1": its schematic extension has version "", not a schematic ID: pass the installer with --installer-image cp-1=<factory>/installer/<schematic>:v1.14.1`,
		},
		{
			name: "nothing read: refused, not guessed", configured: plain,
			wantErr: `node "cp-1": its system extensions were not read: pass the installer with --installer-image cp-1=REPOSITORY:v1.14.1`,
		},
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			target := stages.MustParseVersion("v1.14.1")
			if tt.target != "" {
				target = stages.MustParseVersion(tt.target)
			}

			got, err := stages.ChooseInstaller("cp-1", tt.configured, tt.installed, tt.flags, target)
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)

				return
			}

			require.NoError(t, err)
			assert.Equal(t, tt.want, got.Image)
			assert.Equal(t, tt.source, got.Source)
			assert.Equal(t, tt.expect, got.Expect)
			assert.Equal(t, tt.drops, got.Drops)
		})
	}
}

// The plan says why in the installer's reason.
func TestInstallerReasons(t *testing.T) {
	target := stages.MustParseVersion("v1.14.1")

	got, err := stages.ChooseInstaller("cp-1", "ghcr.io/siderolabs/installer:v1.13.9", &talos.Installed{Platform: "metal"}, stages.InstallerFlags{}, target)
	require.NoError(t, err)
	assert.Equal(t, "Talos 1.14 publishes no ghcr.io/siderolabs/installer: Talos' default, the Image Factory installer of the empty schematic", got.Reason())

	got, err = stages.ChooseInstaller("cp-1", "", &talos.Installed{Platform: "metal", Extensions: []talos.Extension{iscsi, factoryExt(schematicA)}},
		stages.InstallerFlags{Image: "factory.talos.dev/metal-installer/" + schematicB + ":v1.14.1", DropExtensions: []string{"cp-1"}}, target)
	require.NoError(t, err)
	assert.Equal(t, "--installer-image, with --drop-extensions: drops schematic 5a8a2c5d1c6e, iscsi-tools", got.Reason())
}

// The flags read as documented, and refuse what they cannot mean.
func TestParseInstallerFlags(t *testing.T) {
	target := stages.MustParseVersion("v1.14.1")

	f, err := stages.ParseInstallerFlags([]string{"my.registry/installer:v1.14.1", "worker-1=registry.local/metal-installer/" + schematicA + ":v1.14.1"},
		[]string{"worker-2", "worker-3", "worker-2"}, target, "--to")
	require.NoError(t, err)
	assert.Equal(t, stages.InstallerFlags{
		Image:          "my.registry/installer:v1.14.1",
		Nodes:          map[string]string{"worker-1": "registry.local/metal-installer/" + schematicA + ":v1.14.1"},
		DropExtensions: []string{"worker-2", "worker-3"},
	}, f)
	assert.Equal(t, "registry.local/metal-installer/"+schematicA+":v1.14.1", f.For("worker-1"))
	assert.Equal(t, "my.registry/installer:v1.14.1", f.For("worker-2"))
	assert.True(t, f.Drops("worker-3"))
	assert.False(t, f.Drops("worker-1"))

	for _, tc := range []struct {
		images, drop []string
		want         string
	}{
		{images: []string{"ghcr.io/siderolabs/installer:v1.13.8"}, want: `--installer-image "ghcr.io/siderolabs/installer:v1.13.8" is tagged v1.13.8 but --to is v1.14.1: make them agree`},
		{images: []string{"worker-1=my.registry/installer"}, want: `--installer-image "my.registry/installer": pass REPOSITORY:TAG`},
		{images: []string{"=my.registry/installer:v1.14.1"}, want: `--installer-image "=my.registry/installer:v1.14.1": pass IMAGE for every node or NODE=IMAGE for one`},
		{images: []string{"a/installer:v1.14.1", "b/installer:v1.14.1"}, want: `--installer-image is given twice for every node`},
		{images: []string{"w=a/installer:v1.14.1", "w=b/installer:v1.14.1"}, want: `--installer-image is given twice for node w`},
		{drop: []string{""}, want: `--drop-extensions: name the nodes`},
	} {
		_, err := stages.ParseInstallerFlags(tc.images, tc.drop, target, "--to")
		require.ErrorContains(t, err, tc.want)
	}

	_, err = stages.ParseInstallerFlags([]string{"ghcr.io/siderolabs/installer:v1.13.8"}, nil, target, "--talos")
	require.ErrorContains(t, err, `is tagged v1.13.8 but --talos is v1.14.1`, "a path's Talos target is --talos")
}

func TestPlanTalosShowsTheSchematicInstaller(t *testing.T) {
	c := discoverytest.ThreePlusTwo()
	c.Node("worker-1").Installed = &talos.Installed{Platform: "metal", Extensions: []talos.Extension{iscsi, drbd, factoryExt(schematicA)}}

	plan, err := stages.PlanTalos(c.Snapshot(t), stages.MustParseVersion("v1.14.1"), stages.InstallerFlags{}, stages.Options{})
	require.NoError(t, err)

	var found bool

	for _, n := range plan.Stages[0].Nodes {
		installer := n.Changes[1]
		if n.Node != "worker-1" {
			// Talos 1.14 publishes no generic installer: the vanilla nodes get
			// Talos' default, and the plan says why.
			assert.Equal(t, "factory.talos.dev/metal-installer/"+stages.EmptySchematic+":v1.14.1", installer.To, n.Node)
			assert.Contains(t, installer.Reason, "Talos 1.14 publishes no ghcr.io/siderolabs/installer", n.Node)

			continue
		}

		found = true

		assert.Equal(t, "ghcr.io/siderolabs/installer:v1.13.9", installer.From)
		assert.Equal(t, "factory.talos.dev/metal-installer/"+schematicA+":v1.14.1", installer.To)
		assert.Equal(t, "the node's schematic 5a8a2c5d1c6e (keeps iscsi-tools, drbd); its config names another installer", installer.Reason)
		require.NotNil(t, n.Installed)
		assert.Equal(t, schematicA, n.Installed.Schematic)
		assert.Equal(t, []string{"iscsi-tools v0.2.0", "drbd 9.2.14-v1.14.1"}, n.Installed.Extensions)
	}

	assert.True(t, found)

	c.Node("worker-1").Installed = &talos.Installed{Platform: "metal", Extensions: []talos.Extension{iscsi}}

	_, err = stages.PlanTalos(c.Snapshot(t), stages.MustParseVersion("v1.14.1"), stages.InstallerFlags{}, stages.Options{})
	require.ErrorContains(t, err, `node "worker-1" runs system extensions (iscsi-tools) but no Image Factory schematic`)

	plan, err = stages.PlanTalos(c.Snapshot(t), stages.MustParseVersion("v1.14.1"), stages.InstallerFlags{Image: "my.registry/installer:v1.14.1"}, stages.Options{})
	require.NoError(t, err)
	assert.Equal(t, "my.registry/installer:v1.14.1", plan.Stages[0].Nodes[0].Changes[1].To)
	assert.Equal(t, "--installer-image", plan.Stages[0].Nodes[0].Changes[1].Reason)

	// Flags naming a node the cluster does not have are refused.
	_, err = stages.PlanTalos(c.Snapshot(t), stages.MustParseVersion("v1.14.1"),
		stages.InstallerFlags{Nodes: map[string]string{"worker-9": "my.registry/installer:v1.14.1"}}, stages.Options{})
	require.EqualError(t, err, `--installer-image worker-9=my.registry/installer:v1.14.1: the cluster has no node "worker-9"`)
	_, err = stages.PlanTalos(c.Snapshot(t), stages.MustParseVersion("v1.14.1"), stages.InstallerFlags{DropExtensions: []string{"worker-1"}}, stages.Options{})
	require.EqualError(t, err, `--drop-extensions worker-1: no --installer-image is given for it: the installer chosen for a node without one keeps what it runs`)
}

// TestInstallerFlagsRetag: a path's earlier Talos hop takes the operator's installers
// with its own tag, repositories kept; the drops stay.
func TestInstallerFlagsRetag(t *testing.T) {
	f, err := stages.ParseInstallerFlags([]string{
		"factory.talos.dev/metal-installer/abc123:v1.14.1", "worker-1=registry.example.com:5000/installer:v1.14.1",
	}, []string{"worker-1"}, stages.MustParseVersion("v1.14.1"), "--talos")
	require.NoError(t, err)

	got, err := f.Retag(stages.MustParseVersion("v1.13.9"))
	require.NoError(t, err)
	assert.Equal(t, stages.InstallerFlags{
		Image:          "factory.talos.dev/metal-installer/abc123:v1.13.9",
		Nodes:          map[string]string{"worker-1": "registry.example.com:5000/installer:v1.13.9"},
		DropExtensions: []string{"worker-1"},
	}, got)

	none, err := stages.InstallerFlags{}.Retag(stages.MustParseVersion("v1.13.9"))
	require.NoError(t, err)
	assert.Equal(t, stages.InstallerFlags{}, none)
}
