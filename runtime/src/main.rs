//! The `sglrs` command line.

fn main() {
    eprintln!("sglrs: under construction");
    std::process::exit(2);
}
