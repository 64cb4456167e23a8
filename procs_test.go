package main

import (
	"io/fs"
	"testing"
)

// files is a readFile over a map: the /proc and /sys files a test's host has.
func files(m map[string]string) func(string) ([]byte, error) {
	return func(name string) ([]byte, error) {
		if s, ok := m[name]; ok {
			return []byte(s), nil
		}
		return nil, fs.ErrNotExist
	}
}

func TestCgroupQuota(t *testing.T) {
	for _, c := range []struct {
		name  string
		files map[string]string
		want  float64
	}{
		{"no cgroup file", nil, 0},
		{"v2, no quota", map[string]string{
			"/proc/self/cgroup": "0::/system.slice/fulcrum.service\n",
			"/sys/fs/cgroup/system.slice/fulcrum.service/cpu.max": "max 100000\n",
		}, 0},
		{"v2, CPUQuota=150% on the service", map[string]string{
			"/proc/self/cgroup": "0::/system.slice/fulcrum.service\n",
			"/sys/fs/cgroup/system.slice/fulcrum.service/cpu.max": "150000 100000\n",
			"/sys/fs/cgroup/system.slice/cpu.max":                 "max 100000\n",
		}, 1.5},
		{"v2, a tighter parent", map[string]string{
			"/proc/self/cgroup": "0::/system.slice/fulcrum.service\n",
			"/sys/fs/cgroup/system.slice/fulcrum.service/cpu.max": "400000 100000\n",
			"/sys/fs/cgroup/system.slice/cpu.max":                 "50000 100000\n",
		}, 0.5},
		{"v1 cpu,cpuacct", map[string]string{
			"/proc/self/cgroup": "5:memory:/x\n4:cpu,cpuacct:/docker/abc\n",
			"/sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us":  "200000\n",
			"/sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n",
		}, 2},
		{"v1, no quota (-1)", map[string]string{
			"/proc/self/cgroup":                            "4:cpu,cpuacct:/\n",
			"/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us":  "-1\n",
			"/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000\n",
		}, 0},
		{"garbage", map[string]string{
			"/proc/self/cgroup":          "0::/a\n",
			"/sys/fs/cgroup/a/cpu.max":   "lots\n",
			"/sys/fs/cgroup/cpu.max":     "x 100000\n",
			"/sys/fs/cgroup/a/cpu.extra": "1",
		}, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := cgroupQuota(files(c.files)); got != c.want {
				t.Errorf("cgroupQuota = %v; want %v", got, c.want)
			}
		})
	}
}

func TestChooseLoops(t *testing.T) {
	for _, c := range []struct {
		name     string
		set      int
		env      string
		procs    int // runtime.GOMAXPROCS(0) at start
		b        cpuBudget
		want     int
		wantFrom string
	}{
		{"the file wins", 3, "5", 5, cpuBudget{affinity: 8}, 3, "[process] loops"},
		{"then $GOMAXPROCS", 0, "5", 5, cpuBudget{affinity: 8}, 5, "$GOMAXPROCS"},
		{"a bad $GOMAXPROCS is the runtime's to refuse", 0, "many", 8, cpuBudget{affinity: 8}, 8, "one per CPU the process may use: 8 in the affinity mask, no CPU quota"},
		{"every CPU of the mask", 0, "", 4, cpuBudget{affinity: 4}, 4, "one per CPU the process may use: 4 in the affinity mask, no CPU quota"},
		{"a quota rounds up", 0, "", 2, cpuBudget{affinity: 8, quota: 1.5}, 2, "one per CPU the process may use: 8 in the affinity mask, a CPU quota of 1.5"},
		{"a quota under one CPU is one loop (Go's floor is two)", 0, "", 2, cpuBudget{affinity: 8, quota: 0.2}, 1, "one per CPU the process may use: 8 in the affinity mask, a CPU quota of 0.2"},
		{"a quota above the mask", 0, "", 2, cpuBudget{affinity: 2, quota: 6}, 2, "one per CPU the process may use: 2 in the affinity mask, a CPU quota of 6"},
	} {
		t.Run(c.name, func(t *testing.T) {
			n, from := chooseLoops(c.set, c.env, c.procs, c.b)
			if n != c.want || from != c.wantFrom {
				t.Errorf("chooseLoops(%d, %q, %d, %+v) = %d, %q; want %d, %q", c.set, c.env, c.procs, c.b, n, from, c.want, c.wantFrom)
			}
		})
	}
}
