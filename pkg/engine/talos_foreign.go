package engine

import (
	"context"
	"fmt"
	"strings"

	"github.com/ichor-dev/kubectl-ichor/pkg/render"
	"github.com/ichor-dev/kubectl-ichor/pkg/talos"
)

// An install found in a node's boot is rebooted into only when it is the
// one chosen for this operation: machined logs the installer image of each
// lifecycle install (Evidence.Image), and an install of another image (an
// aborted operation's, a `talosctl upgrade --no-reboot`'s) is another
// version, or the target without the extensions the chosen installer
// carries. Replacing it is not a second install: the installer writes the
// slot that is not the bootloader's default, and with an install staged the
// default is the staged slot, so a second install in the same boot writes
// the running slot (GRUB flips the default again; systemd-boot keeps the
// default UKI and removes the others, the running one among them) and the
// known-good version is lost as the fallback. `talosctl rollback`
// (MachineService.Rollback) makes the other slot, the running one, the
// default again and reboots into it; the next boot's install is clean.

// sameInstaller reports whether the installer image logged by machined is
// the one chosen: the same repository (containerd's normalized name: a
// Docker Hub short name gains docker.io/ and library/) and tag, and the same
// digest when both carry one.
func sameInstaller(logged, chosen string) bool {
	if logged == "" || chosen == "" {
		return false
	}

	if render.RepositoryOf(logged) == "" || render.RepositoryOf(chosen) == "" {
		return logged == chosen
	}

	if normalizedRepository(logged) != normalizedRepository(chosen) || render.TagOf(logged) != render.TagOf(chosen) {
		return false
	}

	ld, cd := render.DigestOf(logged), render.DigestOf(chosen)

	return ld == "" || cd == "" || ld == cd
}

// normalizedRepository is an image's repository as containerd names it.
func normalizedRepository(image string) string {
	repo := render.RepositoryOf(image)

	host, path, found := strings.Cut(repo, "/")
	if !found || (!strings.ContainsAny(host, ".:") && host != "localhost") {
		host, path = "docker.io", repo
	}

	if host == "docker.io" && !strings.Contains(path, "/") {
		path = "library/" + path
	}

	return host + "/" + path
}

// foreignPause pauses a node on which machined's log shows an install of
// another installer than chosen in its current boot (completed: staged for
// the next reboot; or running), saying what is staged and how to replace it.
// The node stays cordoned; it is not rebooted.
func (r *talosRun) foreignPause(ctx context.Context, n *osNode, ev talos.Evidence, chosen string) error {
	stage, name, ip := r.stage.Name(), n.Name, n.InternalIP

	what := "an install whose start machined's log no longer holds (its installer unknown)"
	if ev.Image != "" {
		what = "Talos " + orUnknown(render.TagOf(ev.Image)) + " from " + ev.Image
		if render.TagOf(ev.Image) == r.target.String() {
			what += " (the target, from another installer than the chosen one: what it carries differs)"
		}
	}

	var err error

	replace := fmt.Sprintf("talosctl -n %s rollback makes the running Talos' boot slot the default again and reboots the node into the version it runs", ip)
	if n.ControlPlane {
		replace += " (once etcd is healthy: its member restarts)"
	}

	action := replace + fmt.Sprintf("; then resume (kubectl ichor resume), which installs %s; a second install in this boot would write the running boot slot, not replace the staged one. "+
		"Or abort (kubectl ichor abort uncordons the node; its next reboot boots what is staged)", chosen)

	if ev.State == talos.InstallRunning {
		err = fmt.Errorf("node %q: an install of %s runs on it now (machined's log), not of the installer chosen for this operation, %s", name, what, chosen)
		action = fmt.Sprintf("wait for it to end (talosctl -n %s logs machined | grep upgrade); then ", ip) + action
	} else {
		err = fmt.Errorf("node %q: %s is installed in its current boot for its next reboot (machined's log), not the installer chosen for this operation, %s: "+
			"an earlier operation, or a talosctl upgrade that did not reboot, left it staged; it is not rebooted into it", name, what, chosen)
	}

	return r.e.pause(ctx, stage, name, err.Error()+"; the node stays cordoned", action, err)
}
