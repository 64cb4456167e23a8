package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// cpuBudget is what the host lets the process use, read once at start: the
// CPUs of its affinity mask (systemd's CPUAffinity=, taskset, a cpuset) and
// its cgroup's CPU bandwidth quota (CPUQuota=, a container's CPU limit).
// Go's own default GOMAXPROCS is derived from the same two (Go 1.25 and
// later); fulcrum reads them to say where its count comes from, and for the
// one case where its default differs from Go's (chooseLoops).
type cpuBudget struct {
	affinity int     // CPUs in the affinity mask; at least 1
	quota    float64 // CPUs' worth of time the cgroup allows; 0: no quota
}

func (b cpuBudget) String() string {
	q := "no CPU quota"
	if b.quota > 0 {
		q = "a CPU quota of " + strconv.FormatFloat(b.quota, 'f', -1, 64)
	}
	return fmt.Sprintf("%d in the affinity mask, %s", b.affinity, q)
}

// readBudget reads the budget of this process. A mask or quota it cannot
// read counts as none: the host's CPUs are then the bound.
func readBudget() cpuBudget {
	b := cpuBudget{affinity: 1}
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err == nil && set.Count() > 0 {
		b.affinity = set.Count()
	}
	b.quota = cgroupQuota(os.ReadFile)
	return b
}

// cgroupQuota is the tightest CPU quota of the process's cgroup and its
// ancestors, in CPUs, 0 if none: cgroup v2's cpu.max ("max 100000" or
// "150000 100000"), else v1's cpu.cfs_quota_us over cpu.cfs_period_us.
// systemd puts CPUQuota= on the service's own cgroup; a container runtime
// may put it on a parent. readFile is os.ReadFile but in tests.
func cgroupQuota(readFile func(string) ([]byte, error)) float64 {
	self, err := readFile("/proc/self/cgroup")
	if err != nil {
		return 0
	}
	best := 0.0
	tighter := func(q float64) {
		if q > 0 && (best == 0 || q < best) {
			best = q
		}
	}
	sc := bufio.NewScanner(bytes.NewReader(self))
	for sc.Scan() { // "0::/system.slice/fulcrum.service" or "4:cpu,cpuacct:/docker/…"
		f := strings.SplitN(sc.Text(), ":", 3)
		if len(f) != 3 || !strings.HasPrefix(f[2], "/") {
			continue
		}
		switch {
		case f[0] == "0" && f[1] == "":
			for dir := f[2]; ; dir = path.Dir(dir) {
				tighter(cpuMax(readFile, path.Join("/sys/fs/cgroup", dir, "cpu.max")))
				if dir == "/" {
					break
				}
			}
		case hasController(f[1], "cpu"):
			for _, mount := range []string{"/sys/fs/cgroup/" + f[1], "/sys/fs/cgroup/cpu"} {
				for dir := f[2]; ; dir = path.Dir(dir) {
					tighter(cfsQuota(readFile, path.Join(mount, dir)))
					if dir == "/" {
						break
					}
				}
			}
		}
	}
	return best
}

func hasController(list, c string) bool {
	for _, x := range strings.Split(list, ",") {
		if x == c {
			return true
		}
	}
	return false
}

// cpuMax reads a cgroup v2 cpu.max file: quota and period in µs, or "max".
func cpuMax(readFile func(string) ([]byte, error), file string) float64 {
	b, err := readFile(file)
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) != 2 || f[0] == "max" {
		return 0
	}
	return ratio(f[0], f[1])
}

// cfsQuota reads cgroup v1's cpu.cfs_quota_us (-1: none) and cpu.cfs_period_us in dir.
func cfsQuota(readFile func(string) ([]byte, error), dir string) float64 {
	q, err1 := readFile(path.Join(dir, "cpu.cfs_quota_us"))
	p, err2 := readFile(path.Join(dir, "cpu.cfs_period_us"))
	if err1 != nil || err2 != nil {
		return 0
	}
	return ratio(strings.TrimSpace(string(q)), strings.TrimSpace(string(p)))
}

func ratio(quota, period string) float64 {
	q, err1 := strconv.ParseInt(quota, 10, 64)
	p, err2 := strconv.ParseInt(period, 10, 64)
	if err1 != nil || err2 != nil || q <= 0 || p <= 0 {
		return 0
	}
	return float64(q) / float64(p)
}

// chooseLoops is how many event loops (and Go Ps) to run, and why: the
// file's [process] loops if set; else procs, runtime.GOMAXPROCS(0) read at
// start, which is $GOMAXPROCS if that is set (env, as the runtime reads
// it) and else Go's default: one per CPU of the affinity mask, capped by
// the cgroup's quota rounded up (docs/operations.md says why all of them).
// Under a quota of one CPU or less Go's floor is two Ps; fulcrum's
// documented default is one loop there.
func chooseLoops(set int, env string, procs int, b cpuBudget) (int, string) {
	if set > 0 {
		return set, "[process] loops"
	}
	if n, err := strconv.Atoi(strings.TrimSpace(env)); err == nil && n > 0 {
		return procs, "$GOMAXPROCS"
	}
	if b.quota > 0 && b.quota <= 1 {
		procs = 1
	}
	return procs, "one per CPU the process may use: " + b.String()
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}
