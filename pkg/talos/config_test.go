package talos

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/siderolabs/crypto/x509"

	clientconfig "github.com/siderolabs/talos/pkg/machinery/client/config"
	"github.com/siderolabs/talos/pkg/machinery/config/generate/secrets"
	"github.com/siderolabs/talos/pkg/machinery/constants"
	"github.com/siderolabs/talos/pkg/machinery/role"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// isolate points HOME at an empty directory and clears the variables that
// steer the search, so the test sees no talosconfig of the machine it runs on.
func isolate(t *testing.T) (home string) {
	t.Helper()

	home = t.TempDir()
	t.Setenv("HOME", home)

	for _, v := range []string{constants.TalosConfigEnvVar, constants.TalosHomeEnvVar} {
		t.Setenv(v, "") // restores the variable after the test
		require.NoError(t, os.Unsetenv(v))
	}

	return home
}

// inClusterConfig is the talosconfig a talos.dev ServiceAccount mounts.
func inClusterConfig() string {
	return filepath.Join(constants.ServiceAccountMountPath, constants.TalosconfigFilename)
}

// writeTalosconfig writes a real talosconfig (an os:admin client certificate
// signed by a fresh Talos CA) with the given contexts; the first is current unless current
// says otherwise ("-" for none).
func writeTalosconfig(t *testing.T, path, current string, contexts ...string) {
	t.Helper()

	now := time.Now()

	ca, err := secrets.NewTalosCA(now)
	require.NoError(t, err)

	clientCert, err := secrets.NewAdminCertificateAndKey(now, x509.NewCertificateAndKeyFromCertificateAuthority(ca),
		role.MakeSet(role.Admin), time.Hour)
	require.NoError(t, err)

	base := clientconfig.NewConfig("base", nil, ca.CrtPEM, clientCert)

	cfg := &clientconfig.Config{Contexts: map[string]*clientconfig.Context{}}
	for _, name := range contexts {
		c := *base.Contexts[base.Context]
		c.Endpoints = []string{"10.0.0.10"}
		cfg.Contexts[name] = &c
	}

	switch {
	case current == "-":
	case current != "":
		cfg.Context = current
	case len(contexts) > 0:
		cfg.Context = contexts[0]
	}

	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o700))

	b, err := cfg.Bytes()
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, b, 0o600))
}

func TestFindConfig(t *testing.T) {
	if _, err := os.Stat(inClusterConfig()); err == nil {
		t.Skipf("%s exists on this machine: the search would find it", inClusterConfig())
	}

	t.Run("nothing anywhere", func(t *testing.T) {
		home := isolate(t)

		_, err := FindConfig("")

		var notFound *NoTalosconfigError
		require.ErrorAs(t, err, &notFound)
		assert.Equal(t, []string{
			filepath.Join(home, ".talos", "config") + ": not found",
			inClusterConfig() + ": not found",
		}, notFound.Looked)
		assert.Equal(t, "no talosconfig found (looked at "+home+"/.talos/config: not found; "+
			inClusterConfig()+": not found): pass --talosconfig", err.Error())
	})

	t.Run("$TALOSCONFIG missing is named", func(t *testing.T) {
		home := isolate(t)
		t.Setenv(constants.TalosConfigEnvVar, filepath.Join(home, "gone"))

		_, err := FindConfig("")

		var notFound *NoTalosconfigError
		require.ErrorAs(t, err, &notFound)
		require.Len(t, notFound.Looked, 3)
		assert.Equal(t, "$TALOSCONFIG="+filepath.Join(home, "gone")+": not found", notFound.Looked[0])
		assert.Contains(t, err.Error(), "pass --talosconfig")
	})

	t.Run("$TALOSCONFIG first", func(t *testing.T) {
		home := isolate(t)
		env := filepath.Join(home, "env-config")
		writeTalosconfig(t, env, "", "a")
		writeTalosconfig(t, filepath.Join(home, ".talos", "config"), "", "b")
		t.Setenv(constants.TalosConfigEnvVar, env)

		got, err := FindConfig("")
		require.NoError(t, err)
		assert.Equal(t, env, got)
	})

	t.Run("falls through to ~/.talos/config", func(t *testing.T) {
		home := isolate(t)
		writeTalosconfig(t, filepath.Join(home, ".talos", "config"), "", "b")
		t.Setenv(constants.TalosConfigEnvVar, filepath.Join(home, "gone"))

		got, err := FindConfig("")
		require.NoError(t, err)
		assert.Equal(t, filepath.Join(home, ".talos", "config"), got)
	})

	t.Run("$TALOS_HOME", func(t *testing.T) {
		home := isolate(t)
		talosHome := filepath.Join(home, "elsewhere")
		writeTalosconfig(t, filepath.Join(talosHome, "config"), "", "b")
		t.Setenv(constants.TalosHomeEnvVar, talosHome)

		got, err := FindConfig("")
		require.NoError(t, err)
		assert.Equal(t, filepath.Join(talosHome, "config"), got)
	})

	t.Run("explicit path must exist and is not created", func(t *testing.T) {
		home := isolate(t)
		missing := filepath.Join(home, "missing")

		_, err := FindConfig(missing)
		require.EqualError(t, err, "talosconfig "+missing+": not found: check the --talosconfig path")

		_, statErr := os.Stat(missing)
		assert.True(t, os.IsNotExist(statErr), "FindConfig must not create the file")
	})

	t.Run("explicit directory", func(t *testing.T) {
		home := isolate(t)

		_, err := FindConfig(home)
		require.ErrorContains(t, err, "is a directory")
	})

	t.Run("the search creates nothing", func(t *testing.T) {
		home := isolate(t)

		_, err := FindConfig("")
		require.Error(t, err)

		_, statErr := os.Stat(filepath.Join(home, ".talos"))
		assert.True(t, os.IsNotExist(statErr), "the search must not create ~/.talos")
	})
}

func TestOpenContexts(t *testing.T) {
	for _, tc := range []struct {
		name     string
		current  string
		contexts []string
		ask      string
		want     string // the context chosen
		err      string
	}{
		{name: "current context", contexts: []string{"prod", "staging"}, want: "prod"},
		{name: "asked context", contexts: []string{"prod", "staging"}, ask: "staging", want: "staging"},
		{name: "the only context when none is current", current: "-", contexts: []string{"prod"}, want: "prod"},
		{
			name:     "unknown context",
			contexts: []string{"staging", "prod"},
			ask:      "dev",
			err:      `has no context "dev": pass one of prod, staging with --talos-context`,
		},
		{
			name:     "current context missing",
			current:  "gone",
			contexts: []string{"prod"},
			err:      `has no context "gone": pass one of prod with --talos-context`,
		},
		{
			name:     "no current context among several",
			current:  "-",
			contexts: []string{"prod", "staging"},
			err:      "has no current context: pass one of prod, staging with --talos-context",
		},
		{name: "no contexts", current: "-", err: "has no contexts: pass a talosconfig that has one with --talosconfig"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			home := isolate(t)
			path := filepath.Join(home, "talosconfig")
			writeTalosconfig(t, path, tc.current, tc.contexts...)

			c, err := Open(t.Context(), Options{ConfigPath: path, Context: tc.ask})
			if tc.err != "" {
				var ctxErr *ContextError
				require.ErrorAs(t, err, &ctxErr)
				assert.Equal(t, "talosconfig "+path+" "+tc.err, err.Error())

				return
			}

			require.NoError(t, err)
			t.Cleanup(func() { assert.NoError(t, c.Close()) })

			assert.Equal(t, tc.want, c.ContextName())
			assert.Equal(t, path, c.ConfigPath())
			assert.Equal(t, []string{"10.0.0.10"}, c.Endpoints())
		})
	}
}

func TestOpenEndpoints(t *testing.T) {
	home := isolate(t)
	path := filepath.Join(home, "talosconfig")
	writeTalosconfig(t, path, "", "prod")

	c, err := Open(context.Background(), Options{ConfigPath: path, Endpoints: []string{"10.0.0.11", "10.0.0.12"}})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, c.Close()) })
	assert.Equal(t, []string{"10.0.0.11", "10.0.0.12"}, c.Endpoints())

	// A context without endpoints needs the flag.
	cfg, err := clientconfig.Open(path)
	require.NoError(t, err)
	cfg.Contexts["prod"].Endpoints = nil
	require.NoError(t, cfg.Save(path))

	_, err = Open(context.Background(), Options{ConfigPath: path})
	require.EqualError(t, err, "talosconfig "+path+`: context "prod" has no endpoints: pass --talos-endpoints`)
}

func TestOpenNotATalosconfig(t *testing.T) {
	home := isolate(t)
	path := filepath.Join(home, "talosconfig")
	require.NoError(t, os.WriteFile(path, []byte("contexts: [1, 2"), 0o600))

	_, err := Open(context.Background(), Options{ConfigPath: path})
	require.ErrorContains(t, err, "talosconfig "+path+": not a talosconfig")
}
