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
	target := stages.MustParseVersion("v1.14.1")
	plain := "ghcr.io/siderolabs/installer:v1.13.9"

	tests := []struct {
		name       string
		configured string
		installed  *talos.Installed
		explicit   string
		want       string
		source     string
		wantErr    string
	}{
		{
			name: "no extensions: the configured installer at the target", configured: plain,
			installed: &talos.Installed{Platform: "metal"},
			want:      "ghcr.io/siderolabs/installer:v1.14.1", source: stages.InstallerConfigured,
		},
		{
			name: "a mirror, no extensions: its repository kept", configured: "registry.local:5000/siderolabs/installer:v1.13.9",
			installed: &talos.Installed{Platform: "metal"},
			want:      "registry.local:5000/siderolabs/installer:v1.14.1", source: stages.InstallerConfigured,
		},
		{
			name:       "schematic with extensions, plain installer configured: the factory installer of the schematic",
			configured: plain, installed: &talos.Installed{Platform: "metal", Extensions: []talos.Extension{iscsi, drbd, factoryExt(schematicA)}},
			want: "factory.talos.dev/metal-installer/" + schematicA + ":v1.14.1", source: stages.InstallerSchematic,
		},
		{
			name:       "schematic on aws with SecureBoot: that platform's secureboot installer",
			configured: plain, installed: &talos.Installed{Platform: "aws", SecureBoot: true, Extensions: []talos.Extension{factoryExt(schematicA), iscsi}},
			want: "factory.talos.dev/aws-installer-secureboot/" + schematicA + ":v1.14.1", source: stages.InstallerSchematic,
		},
		{
			name: "self-hosted factory: its host from the extension's author", configured: plain,
			installed: &talos.Installed{Platform: "metal", Extensions: []talos.Extension{
				{Name: "schematic", Version: schematicA, Author: "Image Factory (https://factory.example.com/)"}, iscsi,
			}},
			want: "factory.example.com/metal-installer/" + schematicA + ":v1.14.1", source: stages.InstallerSchematic,
		},
		{
			name:       "the configured legacy factory installer of the same schematic: kept, tag moved",
			configured: "factory.talos.dev/installer/" + schematicA + ":v1.13.9",
			installed:  &talos.Installed{Platform: "metal", Extensions: []talos.Extension{iscsi, factoryExt(schematicA)}},
			want:       "factory.talos.dev/installer/" + schematicA + ":v1.14.1", source: stages.InstallerConfigured,
		},
		{
			name:       "a mirror of the factory installer of the same schematic: kept",
			configured: "registry.local/factory/metal-installer-secureboot/" + schematicA + ":v1.13.9",
			installed:  &talos.Installed{Platform: "metal", SecureBoot: true, Extensions: []talos.Extension{factoryExt(schematicA)}},
			want:       "registry.local/factory/metal-installer-secureboot/" + schematicA + ":v1.14.1", source: stages.InstallerConfigured,
		},
		{
			name:       "the default schematic, no extension: still its factory installer (kernel args, overlay)",
			configured: plain, installed: &talos.Installed{Platform: "metal", Extensions: []talos.Extension{factoryExt(schematicB)}},
			want: "factory.talos.dev/metal-installer/" + schematicB + ":v1.14.1", source: stages.InstallerSchematic,
		},
		{
			name: "--image wins over everything", configured: plain, explicit: "my.registry/installer:v1.14.1",
			installed: &talos.Installed{Platform: "metal", Extensions: []talos.Extension{iscsi}},
			want:      "my.registry/installer:v1.14.1", source: stages.InstallerFlag,
		},
		{
			name: "--image without anything read", explicit: "my.registry/installer:v1.14.1",
			want: "my.registry/installer:v1.14.1", source: stages.InstallerFlag,
		},
		{
			name: "extensions without a schematic: refused", configured: plain,
			installed: &talos.Installed{Platform: "metal", Extensions: []talos.Extension{iscsi, drbd}},
			wantErr:   `node "cp-1" runs system extensions (iscsi-tools, drbd) but no Image Factory schematic: the installer that keeps them cannot be derived: pass it with --image REPOSITORY:v1.14.1`,
		},
		{
			name: "the configured factory installer of another schematic: refused", configured: "factory.talos.dev/metal-installer/" + schematicB + ":v1.13.9",
			installed: &talos.Installed{Platform: "metal", Extensions: []talos.Extension{iscsi, factoryExt(schematicA)}},
			wantErr:   `node "cp-1" runs schematic 5a8a2c5d1c6e but its config names the installer of schematic 376567988ad3 (factory.talos.dev/metal-installer/` + schematicB + `:v1.13.9): pass the one to install with --image, e.g. --image factory.talos.dev/metal-installer/` + schematicA + `:v1.14.1`,
		},
		{
			name: "a schematic whose factory is not named: refused", configured: plain,
			installed: &talos.Installed{Platform: "metal", Extensions: []talos.Extension{{Name: "schematic", Version: schematicA, Author: "Image Factory"}}},
			wantErr:   `node "cp-1" runs schematic 5a8a2c5d1c6e but its Image Factory is not named (extension author "Image Factory"): pass the installer with --image <factory>/installer/` + schematicA + `:v1.14.1`,
		},
		{
			name: "a schematic version that is no ID: refused", configured: plain,
			installed: &talos.Installed{Platform: "metal", Extensions: []talos.Extension{factoryExt("")}},
			wantErr:   `node "cp-1": its schematic extension has version "", not a schematic ID: pass the installer with --image <factory>/installer/<schematic>:v1.14.1`,
		},
		{
			name: "no extensions, no configured installer: refused", installed: &talos.Installed{Platform: "metal"},
			wantErr: `node "cp-1": its machine config names no installer (machine.install.image): pass the installer with --image REPOSITORY:v1.14.1`,
		},
		{
			name: "nothing read: refused, not guessed", configured: plain,
			wantErr: `node "cp-1": its system extensions were not read: pass the installer with --image REPOSITORY:v1.14.1`,
		},
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := stages.ChooseInstaller("cp-1", tt.configured, tt.installed, tt.explicit, target)
			if tt.wantErr != "" {
				require.EqualError(t, err, tt.wantErr)

				return
			}

			require.NoError(t, err)
			assert.Equal(t, tt.want, got.Image)
			assert.Equal(t, tt.source, got.Source)
		})
	}
}

func TestPlanTalosShowsTheSchematicInstaller(t *testing.T) {
	c := discoverytest.ThreePlusTwo()
	c.Node("worker-1").Installed = &talos.Installed{Platform: "metal", Extensions: []talos.Extension{iscsi, drbd, factoryExt(schematicA)}}

	plan, err := stages.PlanTalos(c.Snapshot(t), stages.MustParseVersion("v1.14.1"), "", stages.Options{})
	require.NoError(t, err)

	var found bool

	for _, n := range plan.Stages[0].Nodes {
		installer := n.Changes[1]
		if n.Node != "worker-1" {
			assert.Equal(t, "ghcr.io/siderolabs/installer:v1.14.1", installer.To, n.Node)
			assert.Empty(t, installer.Reason, n.Node)

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

	_, err = stages.PlanTalos(c.Snapshot(t), stages.MustParseVersion("v1.14.1"), "", stages.Options{})
	require.ErrorContains(t, err, `node "worker-1" runs system extensions (iscsi-tools) but no Image Factory schematic`)

	plan, err = stages.PlanTalos(c.Snapshot(t), stages.MustParseVersion("v1.14.1"), "my.registry/installer:v1.14.1", stages.Options{})
	require.NoError(t, err)
	assert.Equal(t, "my.registry/installer:v1.14.1", plan.Stages[0].Nodes[0].Changes[1].To)
	assert.Equal(t, "--image", plan.Stages[0].Nodes[0].Changes[1].Reason)
}
