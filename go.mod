module fulcrum

go 1.26.8

require (
	github.com/BurntSushi/toml v1.6.0
	github.com/rs/zerolog v1.35.1
	golang.org/x/sys v0.50.0
)

require (
	github.com/fsnotify/fsnotify v1.10.1 // indirect
	github.com/mattn/go-colorable v0.1.14 // indirect
	github.com/mattn/go-isatty v0.0.20 // indirect
	go.uber.org/goleak v1.3.0 // indirect
)
