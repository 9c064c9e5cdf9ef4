package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ichor-dev/kubectl-ichor/e2e/sim/cluster"
	"github.com/ichor-dev/kubectl-ichor/e2e/sim/kubelet"
)

const usage = `ichor-sim runs a local simulated Talos cluster on a real Kubernetes control plane.

Usage:
  ichor-sim up --dir DIR [flags]    start a cluster in DIR and return once it is Ready
  ichor-sim down --dir DIR          stop the cluster of DIR
  ichor-sim status --dir DIR        say whether a cluster runs in DIR

Run "ichor-sim up -h" for the flags of up.
`

func run(ctx context.Context, args []string) error {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, usage)
		return errors.New("a command is required: up, down or status")
	}
	switch args[0] {
	case "up":
		return up(ctx, args[1:])
	case "serve":
		return serve(ctx, args[1:])
	case "down":
		return down(args[1:])
	case "status":
		return status(args[1:])
	case "exec-pod":
		fs := flag.NewFlagSet("exec-pod", flag.ContinueOnError)
		spec := fs.String("spec", "", "the container's exec spec")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		return kubelet.RunPod(*spec)
	case "-h", "--help", "help":
		fmt.Print(usage)
		return nil
	}
	return fmt.Errorf("unknown command %q: want up, down or status", args[0])
}

// clusterFlags binds the options of up (and of the daemon it starts).
func clusterFlags(name string) (*flag.FlagSet, *cluster.Options, *time.Duration) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	o := &cluster.Options{Latency: cluster.DefaultLatency(), Images: map[string]string{}}
	exe, _ := os.Executable()
	fs.StringVar(&o.Dir, "dir", "", "directory for the cluster's kubeconfig, talosconfig, events.jsonl and logs (required)")
	fs.StringVar(&o.Name, "name", "ichor-sim", "cluster name")
	fs.IntVar(&o.ControlPlanes, "control-planes", 3, "number of control-plane machines")
	fs.IntVar(&o.Workers, "workers", 2, "number of worker machines")
	fs.StringVar(&o.KubernetesVersion, "kubernetes", "v1.35.4", "Kubernetes version every component starts at")
	fs.StringVar(&o.TalosVersion, "talos", "v1.13.9", "Talos version every machine runs")
	fs.StringVar(&o.BornOn, "born-on", "", "Talos version the cluster was bootstrapped on (default --talos): its bootstrap objects and machine configs are that version's")
	fs.StringVar(&o.BinDir, "bin-dir", filepath.Join(filepath.Dir(exe), "..", "cluster-bins"), "directory with etcd, kube-apiserver, kube-controller-manager and kube-scheduler")
	fs.StringVar(&o.FaultsFile, "faults", "", "faults file (YAML, re-read when it changes); see the faults package")
	fs.StringVar(&o.ConfigLayout, "config-layout", "", "where the machine configs keep the Kubernetes settings: "+strings.Join(cluster.ConfigLayouts(), ", ")+" (default: as talosctl gen config of --talos writes them)")
	fs.Func("mirror", "RELEASE,...: run a private registry on the control plane's address (port 5000) holding these Kubernetes releases (and --kubernetes), the machine configs' Kubernetes images on it", func(v string) error {
		o.Mirror = append(o.Mirror, strings.Split(v, ",")...)
		return nil
	})
	fs.BoolVar(&o.TalosAPIAccess, "talos-api-access", true, "enable kubernetesTalosAPIAccess (os:admin, namespace ichor-system) on the control planes")
	fs.Func("image", "REPOSITORY=DIR: pods with this image run as local processes, DIR standing for the image's root filesystem (repeatable)", func(v string) error {
		repo, dir, ok := strings.Cut(v, "=")
		if !ok || repo == "" || dir == "" {
			return fmt.Errorf("want REPOSITORY=DIR, got %q", v)
		}
		abs, err := filepath.Abs(dir)
		if err != nil {
			return err
		}
		o.Images[repo] = abs
		return nil
	})
	fs.Func("extensions", "NODE=NAME[@VERSION],...: system extensions machine NODE was installed with (repeatable)", func(v string) error {
		node, list, ok := strings.Cut(v, "=")
		if !ok || node == "" || list == "" {
			return fmt.Errorf("want NODE=NAME[@VERSION],..., got %q", v)
		}
		if o.Extensions == nil {
			o.Extensions = map[string][]string{}
		}
		o.Extensions[node] = append(o.Extensions[node], strings.Split(list, ",")...)
		return nil
	})
	fs.Func("schematic", "NODE=ID: the Image Factory schematic machine NODE was installed from (repeatable)", func(v string) error {
		node, id, ok := strings.Cut(v, "=")
		if !ok || node == "" || id == "" {
			return fmt.Errorf("want NODE=SCHEMATIC-ID, got %q", v)
		}
		if o.Schematics == nil {
			o.Schematics = map[string]string{}
		}
		o.Schematics[node] = id
		return nil
	})
	fs.Func("boot-loader", "NODE=grub|sd-boot: the boot loader machine NODE boots with (default grub; sd-boot boots a UKI) (repeatable)", func(v string) error {
		node, bl, ok := strings.Cut(v, "=")
		if !ok || node == "" || bl == "" {
			return fmt.Errorf("want NODE=grub or NODE=sd-boot, got %q", v)
		}
		if o.BootLoaders == nil {
			o.BootLoaders = map[string]string{}
		}
		o.BootLoaders[node] = bl
		return nil
	})
	fs.Func("kernel-args", "NODE=ARG,...: machine NODE's machine.install.extraKernelArgs (repeatable)", func(v string) error {
		node, list, ok := strings.Cut(v, "=")
		if !ok || node == "" || list == "" {
			return fmt.Errorf("want NODE=ARG,..., got %q", v)
		}
		if o.KernelArgs == nil {
			o.KernelArgs = map[string][]string{}
		}
		o.KernelArgs[node] = append(o.KernelArgs[node], strings.Split(list, ",")...)
		return nil
	})
	fs.Func("inline-manifest", "NAME=FILE: the control planes carry FILE (multi-document YAML) in cluster.inlineManifests as NAME (repeatable)", func(v string) error {
		name, file, ok := strings.Cut(v, "=")
		if !ok || name == "" || file == "" {
			return fmt.Errorf("want NAME=FILE, got %q", v)
		}
		b, err := os.ReadFile(file)
		if err != nil {
			return err
		}
		o.InlineManifests = append(o.InlineManifests, cluster.InlineManifest{Name: name, Contents: string(b)})
		return nil
	})
	fs.Func("extra-manifest", "URL: the control planes carry URL in cluster.extraManifests, fetched as Talos does (repeatable)", func(v string) error {
		o.ExtraManifests = append(o.ExtraManifests, v)
		return nil
	})
	fs.DurationVar(&o.Latency.StaticPodRestart, "static-pod-restart", o.Latency.StaticPodRestart, "how long a static pod takes to restart on a new image")
	fs.DurationVar(&o.Latency.Ready, "ready-latency", o.Latency.Ready, "how long a started container takes to become Ready, and a booted node after its kubelet starts")
	fs.DurationVar(&o.Latency.KubeletRestart, "kubelet-restart", o.Latency.KubeletRestart, "how long a node is NotReady while its kubelet restarts")
	fs.DurationVar(&o.Latency.PodStart, "pod-start", o.Latency.PodStart, "how long a bound pod takes to start")
	fs.DurationVar(&o.Latency.ImagePull, "image-pull", o.Latency.ImagePull, "how long a Talos image pull takes")
	fs.DurationVar(&o.Latency.Reboot, "reboot", o.Latency.Reboot, "how long a Talos reboot keeps the machine down")
	fs.DurationVar(&o.Latency.ManifestRender, "manifest-render", o.Latency.ManifestRender, "how long after a config change a control plane re-renders its bootstrap manifests")
	wait := fs.Duration("wait", 3*time.Minute, "how long up waits for the cluster to be Ready")
	return fs, o, wait
}

func up(ctx context.Context, args []string) error {
	fs, o, wait := clusterFlags("up")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q: every option is a flag", fs.Args())
	}
	if err := o.Validate(); err != nil {
		return err
	}
	for _, b := range []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
		if _, err := os.Stat(filepath.Join(o.BinDir, b)); err != nil {
			return fmt.Errorf("%s not found in %s: run make cluster-bins, or pass --bin-dir", b, o.BinDir)
		}
	}
	if pid, ok := running(o.Dir); ok {
		return fmt.Errorf("a cluster already runs in %s (pid %d): run ichor-sim down --dir %s first", o.Dir, pid, o.Dir)
	}
	if err := os.MkdirAll(filepath.Join(o.Dir, cluster.LogDir), 0o755); err != nil {
		return err
	}
	_ = os.Remove(filepath.Join(o.Dir, cluster.ReadyFile))
	logPath := filepath.Join(o.Dir, cluster.LogDir, "ichor-sim.log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer logFile.Close()
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	daemonArgs := append([]string{"serve"}, args...)
	daemonArgs = append(daemonArgs, "--dir", o.Dir, "--bin-dir", o.BinDir)
	cmd := exec.Command(exe, daemonArgs...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start the cluster daemon: %w", err)
	}
	pid := cmd.Process.Pid
	if err := os.WriteFile(filepath.Join(o.Dir, cluster.PIDFile), []byte(strconv.Itoa(pid)), 0o644); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	fmt.Printf("Starting cluster %q in %s: %d control planes, %d workers, Kubernetes %s, Talos %s\n",
		o.Name, o.Dir, o.ControlPlanes, o.Workers, o.KubernetesVersion, o.TalosVersion)
	deadline := time.After(*wait)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-exited:
			return fmt.Errorf("the cluster daemon exited (%v) before the cluster was Ready:\n%s", err, tail(logPath, 15))
		case <-ctx.Done():
			_ = syscall.Kill(pid, syscall.SIGTERM)
			return errors.New("interrupted: the cluster is being stopped")
		case <-deadline:
			_ = syscall.Kill(pid, syscall.SIGTERM)
			return fmt.Errorf("the cluster was not Ready after %s (see %s):\n%s", *wait, logPath, tail(logPath, 15))
		case <-tick.C:
			b, err := os.ReadFile(filepath.Join(o.Dir, cluster.ReadyFile))
			if err != nil {
				continue
			}
			var info cluster.Info
			if err := json.Unmarshal(b, &info); err != nil {
				continue
			}
			fmt.Printf("Cluster %q is Ready in %s (API %s).\n", info.Name, info.StartedIn, info.APIServer)
			fmt.Printf("  export KUBECONFIG=%s\n", filepath.Join(o.Dir, cluster.KubeconfigFile))
			fmt.Printf("  export TALOSCONFIG=%s\n", filepath.Join(o.Dir, cluster.TalosconfigFile))
			fmt.Printf("Stop it with: ichor-sim down --dir %s\n", o.Dir)
			return nil
		}
	}
}

func serve(ctx context.Context, args []string) error {
	fs, o, _ := clusterFlags("serve")
	if err := fs.Parse(args); err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	err = cluster.Run(ctx, *o, exe, log, nil)
	if err != nil {
		log.Error("cluster failed", "err", err)
	}
	return err
}

func down(args []string) error {
	fs := flag.NewFlagSet("down", flag.ContinueOnError)
	dir := fs.String("dir", "", "the cluster's directory (required)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dir == "" {
		return errors.New("--dir is required: the directory given to ichor-sim up")
	}
	pid, ok := running(*dir)
	if !ok {
		fmt.Printf("No cluster runs in %s.\n", *dir)
		return nil
	}
	_ = syscall.Kill(pid, syscall.SIGTERM)
	for range 300 {
		if err := syscall.Kill(pid, 0); err != nil {
			_ = os.Remove(filepath.Join(*dir, cluster.PIDFile))
			fmt.Printf("Cluster in %s stopped.\n", *dir)
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	_ = syscall.Kill(pid, syscall.SIGKILL)
	_ = os.Remove(filepath.Join(*dir, cluster.PIDFile))
	fmt.Printf("Cluster in %s killed after 30s.\n", *dir)
	return nil
}

func status(args []string) error {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	dir := fs.String("dir", "", "the cluster's directory (required)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dir == "" {
		return errors.New("--dir is required")
	}
	pid, ok := running(*dir)
	if !ok {
		fmt.Printf("No cluster runs in %s.\n", *dir)
		return exitError{errors.New("not running")}
	}
	b, _ := os.ReadFile(filepath.Join(*dir, cluster.ReadyFile))
	fmt.Printf("Cluster daemon pid %d.\n%s\n", pid, b)
	return nil
}

// running returns the daemon's pid if one runs for dir.
func running(dir string) (int, bool) {
	b, err := os.ReadFile(filepath.Join(dir, cluster.PIDFile))
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, false
	}
	if err := syscall.Kill(pid, 0); err != nil {
		return 0, false
	}
	// The pid may have been reused: check it is an ichor-sim.
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || !strings.Contains(string(cmdline), "ichor-sim") {
		return 0, false
	}
	return pid, true
}

func tail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(io.LimitReader(f, 16<<20))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return "  " + strings.Join(lines, "\n  ")
}
