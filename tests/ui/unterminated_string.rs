agentry::experiment!("unterminated_string.arl");

fn main() {}
