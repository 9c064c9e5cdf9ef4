package talos

import (
	"testing"

	"github.com/siderolabs/talos/pkg/machinery/extensions"
	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestInstalled(t *testing.T) {
	c, st := serve(t, &fakeNode{platform: "aws"})

	got, err := c.Installed(t.Context(), node)
	require.NoError(t, err)
	assert.Equal(t, Installed{Platform: "aws"}, got, "no extension, no SecurityState: none to keep")

	const id = "376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba"

	// As machined publishes them: one per layer, IDs in the imager's order.
	for i, m := range []extensions.Metadata{
		{Name: "iscsi-tools", Version: "v0.2.0", Author: "Sidero Labs"},
		{Name: "schematic", Version: id, Author: "Image Factory (https://factory.talos.dev)"},
	} {
		r := runtime.NewExtensionStatus(runtime.NamespaceName, []string{"0", "1"}[i])
		r.TypedSpec().Metadata = m
		require.NoError(t, st.Create(t.Context(), r))
	}

	sec := runtime.NewSecurityStateSpec(runtime.NamespaceName)
	sec.TypedSpec().SecureBoot = true
	sec.TypedSpec().BootedWithUKI = true
	require.NoError(t, st.Create(t.Context(), sec))

	got, err = c.Installed(t.Context(), node)
	require.NoError(t, err)
	assert.Equal(t, "aws", got.Platform)
	assert.True(t, got.SecureBoot)
	assert.True(t, got.BootedWithUKI, "systemd-boot, not GRUB")
	assert.Equal(t, []string{"iscsi-tools"}, got.SystemExtensions())

	s, ok := got.Schematic()
	require.True(t, ok)
	assert.Equal(t, id, s.Version)
	assert.Equal(t, "Image Factory (https://factory.talos.dev)", s.Author)
}

func TestInstalledNeedsThePlatform(t *testing.T) {
	c, _ := serve(t, &fakeNode{})

	_, err := c.Installed(t.Context(), node)
	require.ErrorContains(t, err, "the reply names no platform")
}
