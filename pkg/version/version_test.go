package version

import "testing"

func TestDefaultImage(t *testing.T) {
	for _, tc := range []struct {
		name, version, image, want string
	}{
		{name: "unstamped", version: "dev", want: "ghcr.io/ichor-dev/kubectl-ichor:dev"},
		{name: "version only", version: "v0.1.0", want: "ghcr.io/ichor-dev/kubectl-ichor:v0.1.0"},
		{name: "image stamped", version: "v0.1.0", image: "registry.example/ichor:v0.1.0", want: "registry.example/ichor:v0.1.0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			oldVersion, oldImage := Version, Image
			t.Cleanup(func() { Version, Image = oldVersion, oldImage })
			Version, Image = tc.version, tc.image

			if got := DefaultImage(); got != tc.want {
				t.Errorf("DefaultImage() = %q, want %q", got, tc.want)
			}
		})
	}
}
