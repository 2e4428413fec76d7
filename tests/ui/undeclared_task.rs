agentry::experiment!("undeclared_task.arl");

fn main() {}
