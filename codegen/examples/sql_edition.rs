//! Prints the SQL edition's install script: `plain` (for `psql -f`) or `extension` (the
//! script pg_tle registers). `scripts/package.sh --sql` runs it.

fn main() {
    let form = std::env::args().nth(1).unwrap_or_default();
    match form.as_str() {
        "plain" | "extension" => print!("{}", ratelimit_codegen::sql_edition::script(form == "extension")),
        _ => {
            eprintln!("usage: sql_edition plain|extension");
            std::process::exit(2);
        }
    }
}
