package conf_test

import (
	"fmt"

	"fulcrum/conf"
)

// Example validates a file: a valid one gives an immutable *conf.Config,
// an invalid one every problem at once, each located.
func Example() {
	cfg, err := conf.Parse("fulcrum.toml", []byte(`
[services.pg]
listen = ["127.0.0.1:6432"]
on_down = "close"
backends = [{ name = "a", address = "127.0.0.1:5432" }]
`))
	if err != nil {
		fmt.Println(err)
		return
	}
	s := cfg.Services[0]
	fmt.Println(s.Name, s.Listen[0], s.Backends[0].Name, s.OnDown == conf.OnDownClose)

	_, err = conf.Parse("fulcrum.toml", []byte(`
[services.pg]
listen = ["127.0.0.1:6432"]
on_down = "drop"
backends = [{ name = "a", address = "127.0.0.1:5432", weight = -1 }]
`))
	fmt.Println(err) // err joins one *conf.Error per problem; print it and refuse the file
	// Output:
	// pg 127.0.0.1:6432 a true
	// fulcrum.toml:4: services.pg.on_down: "drop" is not one of keep, close
	// fulcrum.toml:5: services.pg.backends[0].weight: must not be negative, have -1
}
